hsap-plan --max-length --model llama-3-8b --gpus 8 --gpu-memory 80 --U 8   # or --config path/to/config.json
# the device's and the host's limits side by side: DeepSpeed ZeRO-3 offload_optimizer, a DGX-H100 node's 2 TB
hsap-plan --max-length --model llama-3-70b --gpus 8 --offload optimizer --host-memory 2048 --gpus-per-node 8
