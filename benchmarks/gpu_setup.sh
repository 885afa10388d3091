# Source on a CUDA machine with no install step: makes this tree importable as compiled_llm
# (and installs carried wheels from .whl/ when present).
ln -sfn ../models compiled_llm/models
ln -sfn ../passes compiled_llm/passes
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
