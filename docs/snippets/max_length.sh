hsap-plan --max-length --model llama-3-8b --gpus 8 --gpu-memory 80 --U 8   # or --config path/to/config.json
