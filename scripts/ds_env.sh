# DeepSpeed's own environment for the scripts that run it beside hf_hsap (sourced by scripts/bench_peers.sh,
# scripts/bench_memory.sh and scripts/deepspeed_cpu_check.sh from the repository root): HSAP_DS_VENV (default
# .venv-ds) with the CPU torch wheel, hf_hsap (editable) and deepspeed with DS_BUILD_OPS=0 (nothing compiled at
# install; its ops compile on first use); sets VENV.
VENV=${HSAP_DS_VENV:-.venv-ds}
export DS_BUILD_OPS=0
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
have() {  # the modules are installed (found, not imported: importing deepspeed takes seconds)
  "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))" "$@"
}
if ! have torch; then
  wheel=$(ls /opt/wheels/torch-2.13.0*cpu*.whl 2>/dev/null | head -n 1 || true)
  "$VENV/bin/pip" install -q "${HSAP_TORCH_SPEC:-${wheel:-torch==2.13.0}}"
fi
if ! have deepspeed hf_hsap transformers; then
  "$VENV/bin/pip" install -q -e . deepspeed
fi
