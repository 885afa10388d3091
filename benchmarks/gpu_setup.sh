# Source on a CUDA machine with no install step: makes this tree importable as compiled_llm
# (and installs carried wheels from .whl/ when present).
ln -sfn ../models compiled_llm/models
ln -sfn ../passes compiled_llm/passes
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
# The engine's own dependencies the device image lacks (the process core's ZMQ and msgpack,
# xgrammar, xxhash, the server's uvicorn and FastAPI): say so at once rather than in each
# benchmark's traceback. Fill .whl/ with
#   bash ../shared/gpu/fetch-wheels.sh pyzmq msgpack xgrammar==0.2.9 xxhash \
#     apache-tvm-ffi==0.1.15.post2 pydantic pydantic-core annotated-types typing-inspection \
#     uvicorn fastapi starlette h11 click anyio sniffio annotated-doc prometheus-client \
#     opentelemetry-api typing-extensions httpx httpcore uvloop httptools
# (and tiktoken sentencepiece regex requests for the gpt-fast peer), then carry .whl.
python3 - <<'CHECK' >&2
import importlib
for name in ("zmq", "msgpack", "xgrammar", "xxhash", "uvicorn", "fastapi", "prometheus_client",
             "httpx", "uvloop", "httptools"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # name the package and why, once, before any benchmark runs
        print(f"gpu_setup.sh: cannot import {name} ({exc!r}): carry .whl (see this file)")
CHECK
