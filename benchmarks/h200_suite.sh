# The H200 runs of the compiler and GPU-speed benchmarks, as two streams on a 2-GPU machine:
# one stream per GPU, each benchmark with its peer in the same stream. Six calls; a call on a
# still-warm machine reuses the checkpoints under $CK (each call makes what it lacks):
#     bash benchmarks/h200_suite.sh 1     # GPU tests, compile start-up
#     bash benchmarks/h200_suite.sh 2     # offline throughput, decode latency, batch sweep, prefill
#     bash benchmarks/h200_suite.sh 3     # compile speed modes with kernel profiles, prefill
#     bash benchmarks/h200_suite.sh 4     # batch sweep (peer at every size), norm kernels
#     bash benchmarks/h200_suite.sh 5     # sync against async scheduling
#     bash benchmarks/h200_suite.sh 6     # compile speed in all five modes, with profiles
#     bash benchmarks/h200_suite.sh 7     # serving (1 and 4 API servers) against offline
#                                         # throughput (one GPU)
#     bash benchmarks/h200_suite.sh 8     # the user's path: default against tuned, sync,
#                                         # process core and the tree in .before/ (one GPU)
#     bash benchmarks/h200_suite.sh 9     # the user's path on Llama-3-8B, then call 7
#     bash benchmarks/h200_suite.sh 10    # GPU tests, LLM's default path, then call 7
#     bash benchmarks/h200_suite.sh 11    # GPU tests, horizontal GEMM fusion on and off
#     bash benchmarks/h200_suite.sh 12    # batch-1 decode against gpt-fast (carry .peer)
#     bash benchmarks/h200_suite.sh 13    # MoE GPU tests and kernels, start-up as processes
#     bash benchmarks/h200_suite.sh 14    # FP8 KV cache tests, FP8 against bf16 KV (one GPU)
#     bash benchmarks/h200_suite.sh 15    # tune the fused MoE (Qwen3-30B-A3B layer), re-time it
#     bash benchmarks/h200_suite.sh 16    # LoRA and quantized tests, quantized and LoRA decode
#     bash benchmarks/h200_suite.sh 17    # spec decode and TP tests, spec and quantized decode
#     bash benchmarks/h200_suite.sh 18    # compressed-tensors GPU tests, quantized decode and
#                                         # nano-vllm (bf16, W4A16, block FP8)
#     bash benchmarks/h200_suite.sh 19    # tune the W4A16 kernel, W4A16 against bf16, LoRA
#     bash benchmarks/h200_suite.sh 20    # LoRA, MiniLM embeddings against
#                                         # sentence-transformers (carry .bench), the W4A16
#                                         # GEMV tiles, W4A16 against bf16
#     bash benchmarks/h200_suite.sh 21    # LoRA GPU tests and decode (grouped deltas), the GPU
#                                         # tests of the QK-norm + RoPE fusion and the MoE kernels
#     bash benchmarks/h200_suite.sh 22    # W4A16 on tinygemm and dequantize-then-matmul: GPU
#                                         # tests, decode (bf16: call 20's, for device time)
#     bash benchmarks/h200_suite.sh 23    # profiles: nano-vllm and batch-1 decode kernels by
#                                         # kind; QK-norm + RoPE fusion on/off (Qwen3-0.6B)
#     bash benchmarks/h200_suite.sh 24    # the one-pass sampler: GPU tests, nano-vllm default
#                                         # with and without it, tuned; Llama-3-8B profile
#     bash benchmarks/h200_suite.sh 25    # tune the small-M GEMM, decode with and without it,
#                                         # the one-pass sampler on the user's path (carry .whl)
#     bash benchmarks/h200_suite.sh 26    # MoE end to end (Qwen3-30B-A3B shape, bf16, against
#                                         # transformers; alone: its checkpoint fills the disk),
#                                         # then the mp executor against uni at TP=1
#     bash benchmarks/h200_suite.sh 27    # speculative decoding, every config (Llama-3-8B)
#     bash benchmarks/h200_suite.sh 28    # verify steps in full graphs: spec GPU tests, n-gram on
#                                         # the quoting answer, the CUDA-graph and EAGLE tests
#     bash benchmarks/h200_suite.sh 29    # the small-M / QK-norm pairs in both orders, gpt-fast
#                                         # (carry .peer), the tuned user path
#     bash benchmarks/h200_suite.sh 30    # serving's ITL tail: the default token budget against
#                                         # --performance-mode interactivity, offline beside
#     bash benchmarks/h200_suite.sh 31    # batch 1 against gpt-fast (carry .peer), default and
#                                         # tuned user path, the fused top-k sampler, start-up
#     bash benchmarks/h200_suite.sh 32    # the sampler alone, serving's ITL tail (default and
#                                         # interactivity, offline beside), start-up
#     bash benchmarks/h200_suite.sh 33    # call 30's serving runs, 8B start-up, a batch-1
#                                         # decode profile (carry .whl)
#     bash benchmarks/h200_suite.sh 34    # call 33 with the server's packages, the QK-norm pair
#     bash benchmarks/h200_suite.sh 35    # one-launch split kernels and the gated GEMM: GPU
#                                         # tests, batch 1 with and without, QK-norm pair
#     bash benchmarks/h200_suite.sh 36    # serving's ITL tail, heap frozen or not (8 client
#                                         # processes), 8B start-up, 8B batch 1 against gpt-fast
#     bash benchmarks/h200_suite.sh 37    # serving's slow gaps beside logged collections and
#                                         # slow steps: 4 or 8 API servers, the prefill cap;
#                                         # the pinned weight reader against safetensors (8B)
#     bash benchmarks/h200_suite.sh 38    # serving with the prefill cap (2.5), offline beside,
#                                         # the cap at 2.0 and off
#     bash benchmarks/h200_suite.sh 39    # piecewise graphs up to 2048 / 4096 tokens, served
#                                         # with the cap or 2048-token steps; 8B start-up
#     bash benchmarks/h200_suite.sh 40    # served steps of 1024 / 1536 / 2048 tokens with
#                                         # graphs up to them, offline beside
#     bash benchmarks/h200_suite.sh 41    # kernel profiles of mixed steps (token budget 1024
#                                         # against the default)
#     bash benchmarks/h200_suite.sh 42    # mixed steps' decodes on the decode kernel: GPU
#                                         # test, served (2048 / default), offline
#     bash benchmarks/h200_suite.sh 43-44 # 8B start-up with the early load; serve-like profiles
#     bash benchmarks/h200_suite.sh 45    # the W4A16 GEMV: GPU tests, tune, 8B batch 1
#     bash benchmarks/h200_suite.sh 46    # start-up diagnostics (import profile), profiles
#     bash benchmarks/h200_suite.sh 47    # the bytecode cache: import profile, 8B start-up
#     bash benchmarks/h200_suite.sh 48    # warm serve with and without the early load
#     bash benchmarks/h200_suite.sh 49    # Triton kernels compiled per start-up phase
#     bash benchmarks/h200_suite.sh 50    # CUDA graphs captured without a cache flush each:
#                                         # their GPU tests, cold compile, two warm serves
#     bash benchmarks/h200_suite.sh 51    # Triton kernels compiled side by side on a cold
#                                         # start: its GPU test, cold compile off and on
#     bash benchmarks/h200_suite.sh 52    # as call 51, the compiles in child processes
#     bash benchmarks/h200_suite.sh 53    # review fixes (one capture stream, children fed by
#                                         # threads): GPU tests, cold compile and a serve
#     bash benchmarks/h200_suite.sh 54    # cold compile and a serve only (children make
#                                         # their CUDA context at their start again)
#     bash benchmarks/h200_suite.sh 55    # GPU tests (graphs, side-by-side compiles), the 8B
#                                         # cold compile with them; Qwen3-0.6B batch 1 with the
#                                         # opt-in fusions one by one; the cold compile without
#     bash benchmarks/h200_suite.sh 56    # programmatic dependent launch: GPU tests of the
#                                         # kernels under it, batch-1 decode on and off (0.6B, 8B)
#     bash benchmarks/h200_suite.sh 57    # PDL levels 0, 1 (wait only) and 2 at batch 1
#     bash benchmarks/h200_suite.sh 58    # the 8B cold compile with the compile children's
#                                         # timeline (ready, first began, last ended)
#     bash benchmarks/h200_suite.sh 59    # the add + RMSNorm in the split-K sum: GPU tests,
#                                         # batch 1 on and off, the pair at 1/8/32, the 8B cold
#                                         # compile (children killed once answered), 8B batch 1
#     bash benchmarks/h200_suite.sh 60    # the gate/up SiLU·mul epilogue too: GPU tests, batch 1
#                                         # with each epilogue off, the epilogue and QK pairs at
#                                         # 1/8/32 in both orders, 8B batch 1
#     bash benchmarks/h200_suite.sh 61    # the QK-norm + RoPE + KV write on by default: batch 1
#                                         # (0.6B, 8B), its GPU tests and the engine's under it
#     bash benchmarks/h200_suite.sh 62    # batch 1's step: kernels and idle gaps, one-launch
#                                         # splits, the EAGLE engine tests
#     bash benchmarks/h200_suite.sh 63    # the one-launch decode: GPU tests, batch 1 against
#                                         # two kernels, the pair at 1/8/32, a profile
#     bash benchmarks/h200_suite.sh 64    # newest key from registers, the tuned SiLU·mul
#                                         # epilogue by default: GPU tests, batch 1, QK pair
#     bash benchmarks/h200_suite.sh 65    # decode splits by context, merged by the last split:
#                                         # GPU tests, the split sweep, batch 1 against the
#                                         # fixed grid in both orders, a profile
#     bash benchmarks/h200_suite.sh 66    # V read with K in decode; Llama-3-8B batch 1 against
#                                         # gpt-fast (carry .whl .peer), the EAGLE engine tests
#     bash benchmarks/h200_suite.sh 67    # the add + RMSNorm in the next GEMM's prologue: GPU
#                                         # tests, batch 1 with and without, a profile
#     bash benchmarks/h200_suite.sh 68    # batch 1 with the prologue by default (0.6B, 8B)
#     bash benchmarks/h200_suite.sh 69    # the 8B cold compile with Inductor's workers started
#                                         # early and not (on, off, off, on); the 8B gate/up
#                                         # epilogue tuned
#     bash benchmarks/h200_suite.sh 70    # the 8B cold compile with kernels' launchers built
#                                         # by the compile children and not; 8B batch 1 with
#                                         # the tuned gate/up epilogue + prologue and without
#     bash benchmarks/h200_suite.sh 71    # the 8B cold compile (decodes first in the dry
#                                         # pass), a warm serve, a second cold compile
#     bash benchmarks/h200_suite.sh 72    # Llama-3-8B batch 1 against gpt-fast on main (carry
#                                         # .whl .peer), Qwen3-0.6B batch 1
#     bash benchmarks/h200_suite.sh 73    # the W4A16 MMA tiles' paired dequantization: GPU
#                                         # tests, a 1- and 4-token tune beside the GEMV and
#                                         # tinygemm, 8B decode at batch 1 and 4
#     bash benchmarks/h200_suite.sh 74    # call 73's tune shipped: 8B W4A16 decode at 4 and 2
#                                         # tokens against tinygemm and bf16
#     bash benchmarks/h200_suite.sh 75    # the MMA tiles with the paired dequantization and
#                                         # without, at 4, 16, 64 tokens (on, off, off, on)
#     bash benchmarks/h200_suite.sh 76    # 8B W4A16 decode at 16 and 64 tokens, the paired
#                                         # dequantization on and off, bf16 beside
#     bash benchmarks/h200_suite.sh 77    # the MMA tiles re-tuned at 16 and 64 tokens; 8B
#                                         # W4A16 decode with them and with the shipped tiles
#     bash benchmarks/h200_suite.sh 78    # W4A16 GPU tests (the pairs' zero off by an FMA);
#                                         # the 8B cold compile without a tokenizer and with
#                                         # Inductor's workers not waited for at exit (three
#                                         # runs), a warm serve
#     bash benchmarks/h200_suite.sh 79    # the 8B cold compile with Inductor's sidecar started
#                                         # beside Dynamo and without, interleaved (the switch
#                                         # was taken out after it: no gain)
#     bash benchmarks/h200_suite.sh 80    # the 8B cold compile with its weights read beside
#                                         # its imports and without (interleaved), a warm
#                                         # serve, the side-by-side compile's GPU test
#     bash benchmarks/h200_suite.sh 81    # the 8B cold compile with its pieces compiled in
#                                         # warm compile children and in the process
#                                         # (interleaved), a warm serve, the GPU tests
#     bash benchmarks/h200_suite.sh 82    # warm 8B serves with the warm-start hint and with
#                                         # side-by-side pieces off; Llama-3-8B nano-vllm profile
#     bash benchmarks/h200_suite.sh 83    # GPU attention tests; 8B and Qwen3-0.6B nano-vllm
#                                         # with the batched 128-key decode tiles and with 64
#     bash benchmarks/h200_suite.sh 89    # issue 19's formats on the user's path: bf16, W4A16,
#                                         # block FP8 at batch 1 and 64, nano-vllm
#     bash benchmarks/h200_suite.sh 90    # GPU attention tests; the 8B half of call 83, ABBA,
#                                         # and 128-key tiles split per 1,024 keys
#     bash benchmarks/h200_suite.sh 91    # FP8 against bf16 KV cache (Llama-3-8B): decode at
#                                         # 64 and 256, the nano-vllm user path (after 90)
#     bash benchmarks/h200_suite.sh 92    # block FP8's one-launch quantization: tests, the
#                                         # GEMMs against cuBLAS block scaling, the user's path
#     bash benchmarks/h200_suite.sh 93    # decode programs launched longest context first:
#                                         # GPU tests, the kernels over mixed contexts,
#                                         # Llama-3-8B nano-vllm ABBA against =0
#     bash benchmarks/h200_suite.sh 94    # Qwen3-0.6B nano-vllm, the same A/B three times
#     bash benchmarks/h200_suite.sh 95    # Llama-3-8B nano-vllm, the same A/B three times
#                                         # (after 93: its checkpoint and kernels)
#     bash benchmarks/h200_suite.sh 96    # serving's slow steps with their device time (the
#                                         # step log), offline beside; warm 8B serves
#     bash benchmarks/h200_suite.sh 98    # issue 14's targets on main: 8B batch 1 against
#                                         # gpt-fast (carry .whl .peer), 0.6B batch 1, the
#                                         # 8B cold compile and warm serves
#     bash benchmarks/h200_suite.sh 99    # fused against unfused at batch 1/8/32, the nano-vllm
#                                         # user path (0.6B default and tuned, 8B default)
#     bash benchmarks/h200_suite.sh 100   # a warm 8B serve's API-server timeline, their
#                                         # imports under -X importtime
#     bash benchmarks/h200_suite.sh 101   # Qwen3-0.6B nano-vllm default and tuned (ABBA),
#                                         # Llama-3-8B nano-vllm default
#     bash benchmarks/h200_suite.sh 84    # the quantized GPU tests, every packed kind (carry
#                                         # .whl with compressed-tensors, loguru, psutil)
#     bash benchmarks/h200_suite.sh 102   # the L2 weight prefetch: 8B batch 1 against gpt-fast,
#                                         # off / on, microbenchmark, GPU tests (.whl .peer)
#     bash benchmarks/h200_suite.sh 104   # call 102 reordered for a short device budget
#     bash benchmarks/h200_suite.sh 103   # 8B batch 1 against gpt-fast, 0.6B on / off, an 8B
#                                         # profile (carry .whl .peer)
#     bash benchmarks/h200_suite.sh 105   # issue 13's served targets on main: offline, served
#                                         # twice, the nano-vllm user path (carry .whl)
#     bash benchmarks/h200_suite.sh 106   # the new architectures' GPU tests, the harmony
#                                         # parsers; on an H200, 8B batch 1 against gpt-fast
#     bash benchmarks/h200_suite.sh 110   # 8B batch 1 against gpt-fast, an 8B profile, the 8B
#                                         # GEMMs' wide tune, the LongRoPE and encoder GPU tests
#                                         # (.whl .peer)
#     bash benchmarks/h200_suite.sh 111   # 8B batch 1, the small-M table against cuBLAS (ABAB)
#     bash benchmarks/h200_suite.sh 12    # batch-1 decode of Llama-3-8B against gpt-fast (one
#                                         # GPU; gpt-fast's tree in .peer/gpt-fast: carry .peer)
# SKIP=batch_sweep leaves out every command that contains that text.
# Logs and results go to $OUT (default bench_out/suite) as one .tgz and one log per stream.
export PYTHONPATH=${PYTHONPATH:-}
set -u
source benchmarks/gpu_setup.sh
CK=${CK:-/tmp/ckpt}
R=${OUT:-bench_out/suite}
LIMIT=${SUITE_SECONDS:-560}  # each stream stops here, so the results are always packed
mkdir -p "$R" /tmp/suite/res
py=${PY:-python3}

END=$(($(date +%s) + LIMIT))

# Qwen3-0.6B served to 8 client processes (calls 37-39): served NAME ENV [serve flags]
# prints the command line that serves, benches into serve_NAME.json and places the slow gaps
served() {
  local cli="$py -m compiled_llm.entrypoints.cli"
  local bench="$cli bench serve --port 8100 --num-prompts 1024 --random-input-len 512 --random-output-len 256 --max-concurrency 256 --ignore-eos --temperature 1.0 --num-client-processes 8 --ready-check-timeout-sec 180 --result-dir $R"
  echo "$2 $cli serve --model $CK/qwen3-0.6b --port 8100 --log-level warning ${*:3} 2> $R/serve_$1.log & s=\$!; $bench --result-filename serve_$1.json; r=\$?; kill \$s; wait \$s; $py -m benchmarks.itl_gaps $R/serve_$1.json --log $R/serve_$1.log; exit \$r"
}

# the 8B cold compile A/B (calls 80-81): cold_ab ON OFF ENV=VALUE prints a first process's
# command (bytecode cache warmed), then the default and the ENV=VALUE rows interleaved twice,
# into startup_cold_{first,ON1,OFF1,ON2,OFF2}.json
cold_ab() {
  local s="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --cold-only"
  echo "$s --json $R/startup_cold_first.json"
  for i in 1 2; do
    echo "$s --json $R/startup_cold_$1$i.json"
    echo "$3 $s --json $R/startup_cold_$2$i.json"
  done
}

stream() {  # stream GPU NAME CMD...: the commands in order on one GPU, logged, until END
  local gpu=$1 name=$2 c left
  shift 2
  for c in "$@"; do
    [[ -n ${SKIP:-} && $c == *$SKIP* ]] && { echo "### skipped (SKIP=$SKIP): $c"; continue; }
    left=$((END - $(date +%s)))
    [ "$left" -gt 10 ] || { echo "### skipped (time): $c"; continue; }
    echo "### $(date +%T) $c"
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 5 "$left" bash -c "$c"
    echo "### $(date +%T) rc=$?"
  done >"/tmp/suite/$name.log" 2>&1
}

run_streams() {  # run_streams "GPU 0 commands" "GPU 1 commands", one command a line
  local a b
  mapfile -t a <<<"$1"
  mapfile -t b <<<"$2"
  stream 0 "gpu0_call$CALL" "${a[@]}" &
  stream 1 "gpu1_call$CALL" "${b[@]}" &
  wait
}

J=/tmp/suite/res
CALL=${1:?usage: h200_suite.sh 1|2|3|4|5|6|7}
MK="$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\")'"
if [ "$CALL" = 1 ]; then
  run_streams "\
$MK
$py -m benchmarks.compile_bench --shape llama3-8b --checkpoint-dir $CK/llama3-8b --max-model-len 4096 --phases startup --json $J/compile_startup_llama3-8b.json" "\
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py tests/kernels/test_triton_gpu.py tests/models"
elif [ "$CALL" = 2 ]; then
  run_streams "\
$MK
$py -m benchmarks.offline_throughput --shape llama3-8b --checkpoint-dir $CK --json $J/offline_llama3-8b.json
$py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --json $J/decode_llama3-8b.json
$py -m benchmarks.batch_sweep --shape llama3-8b --checkpoint-dir $CK --json $J/sweep_llama3-8b.json" "\
$py -m benchmarks.offline_throughput --shape qwen3-0.6b --checkpoint-dir $CK --json $J/offline_qwen3-0.6b.json
$py -m benchmarks.decode_latency --shape qwen3-0.6b --checkpoint-dir $CK --json $J/decode_qwen3-0.6b.json
$py -m benchmarks.batch_sweep --shape qwen3-0.6b --checkpoint-dir $CK --json $J/sweep_qwen3-0.6b.json
$py -m benchmarks.prefill --checkpoint-dir $CK --json $J/prefill.json"
elif [ "$CALL" = 4 ]; then  # the batch sweep alone, the peer given time for every size
  run_streams "\
$MK
$py -m benchmarks.batch_sweep --shape llama3-8b --checkpoint-dir $CK --peer-budget-s 360 --json $J/sweep_llama3-8b.json" "\
$py -m benchmarks.batch_sweep --shape qwen3-0.6b --checkpoint-dir $CK --peer-budget-s 360 --json $J/sweep_qwen3-0.6b.json
$py -m benchmarks.norm_kernels --json $J/norm_kernels.json"
elif [ "$CALL" = 5 ]; then  # sync against async scheduling (sweep and offline peers: calls 2, 4)
  run_streams "\
$MK
$py -m benchmarks.batch_sweep --shape llama3-8b --checkpoint-dir $CK --peer-budget-s 0 --json $J/sweep_async_llama3-8b.json
$py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --json $J/decode_async_llama3-8b.json
$py -m benchmarks.offline_throughput --shape llama3-8b --checkpoint-dir $CK --peer-max-seconds 0 --json $J/offline_async_llama3-8b.json" "\
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py -k async
$py -m benchmarks.offline_throughput --shape qwen3-0.6b --checkpoint-dir $CK --json $J/offline_async_qwen3-0.6b.json
$py -m benchmarks.batch_sweep --shape qwen3-0.6b --checkpoint-dir $CK --peer-budget-s 0 --json $J/sweep_async_qwen3-0.6b.json
$py -m benchmarks.decode_latency --shape qwen3-0.6b --checkpoint-dir $CK --json $J/decode_async_qwen3-0.6b.json"
elif [ "$CALL" = 6 ]; then  # compile_bench speed in every mode, split over the two GPUs
  SPEED="-m benchmarks.compile_bench --shape llama3-8b --max-model-len 4096 --phases speed --profile-dir $J"
  run_streams "\
$MK
$py $SPEED --checkpoint-dir $CK/llama3-8b --speed-modes backend backend+cudagraphs --json $J/compile_speed_a.json" "\
${MK//$CK/${CK}2}
$py $SPEED --checkpoint-dir ${CK}2/llama3-8b --speed-modes eager stock backend-nopasses --json $J/compile_speed_b.json"
elif [ "$CALL" = 7 ]; then  # one GPU: the user's path offline, then served; JSON to $R
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" SIZES="--num-prompts 1024"
  # 1024 requests of 512 prompt tokens and 256 output tokens, temperature 1.0, EOS ignored:
  # offline all at once (max_num_seqs 256 runs at most 256), served at 256 concurrent streams,
  # by one API server, then by four in front of the one engine core (--api-server-count 4)
  SERVE="$CLI bench serve --port 8100 $SIZES --random-input-len 512 --random-output-len 256 --max-concurrency 256 --ignore-eos --temperature 1.0 --num-client-processes 4 --ready-check-timeout-sec 120 --result-dir $R --result-filename serve_qwen3-0.6b.json"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q $SIZES --input-len 512 --output-len 256 --output-json $R/throughput_qwen3-0.6b.json
$CLI serve --model $Q --port 8100 --log-level warning & s=\$!; $SERVE; r=\$?; kill \$s; wait \$s; exit \$r
$CLI serve --model $Q --port 8100 --log-level warning --api-server-count 4 & s=\$!; ${SERVE/serve_qwen3-0.6b.json/serve_qwen3-0.6b_api4.json}; r=\$?; kill \$s; wait \$s; exit \$r
$CLI bench throughput --model $Q --dataset-name nano-vllm --output-json $R/nano_vllm_qwen3-0.6b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 8 ]; then  # one GPU: nano-vllm through LLM.generate, each path its own process
  Q=$CK/qwen3-0.6b UP="$py benchmarks/user_path.py --model $CK/qwen3-0.6b --workload nano-vllm --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py tests/kernels/test_triton_gpu.py tests/engine/test_async_sampling.py
PYTHONPATH=$PWD/.before/tree:$PYTHONPATH COMPILED_LLM_CACHE_DIR=/tmp/cache-before $py .before/user_path_old.py --model $Q --workload nano-vllm --label before-default --json $R/user_path_h200.jsonl
$UP --label default
$UP --label tuned --preset tuned
$UP --label default-sync --engine-args '{\"async_scheduling\":false}'
$UP --label default-core-process --engine-args '{\"engine_core_process\":true}'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 9 ]; then  # one GPU: Llama-3-8B's user path, then serving against offline
  L=$CK/llama3-8b
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$py benchmarks/user_path.py --model $L --workload nano-vllm --label default --json $R/user_path_h200.jsonl
$py benchmarks/user_path.py --model $L --workload nano-vllm --label default-core-process --engine-args '{\"engine_core_process\":true}' --json $R/user_path_h200.jsonl"
  stream 0 "gpu0_call$CALL" "${a[@]}"
  SUITE_SECONDS=$((END - $(date +%s))) CALL=7 bash benchmarks/h200_suite.sh 7
elif [ "$CALL" = 10 ]; then  # one GPU: tests, the default path as LLM picks it, then call 7
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py tests/engine/test_async_sampling.py
$py benchmarks/user_path.py --model $CK/qwen3-0.6b --workload nano-vllm --label default-auto --json $R/user_path_h200.jsonl"
  stream 0 "gpu0_call$CALL" "${a[@]}"
  SUITE_SECONDS=$((END - $(date +%s))) CALL=7 bash benchmarks/h200_suite.sh 7
elif [ "$CALL" = 11 ]; then  # one GPU: tests, then the fused against the unfused layer
  mapfile -t a <<<"\
$MK
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\")'
$py -m pytest -q -x -p no:cacheprovider tests/passes/test_horizontal_gemm.py tests/worker/test_cudagraphs_gpu.py tests/kernels/test_triton_gpu.py tests/passes/test_fp8_linear.py
$py -m benchmarks.horizontal_gemm --checkpoint-dir $CK --json $R/horizontal_gemm_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 12 ]; then  # one GPU: ours (async) and gpt-fast's generate.py; JSON to $R
  [ -f .peer/gpt-fast/generate.py ] || { echo "no .peer/gpt-fast/generate.py: export gpt-fast there (docs/benchmarks.md) and carry .peer" >&2; exit 1; }
  mapfile -t a <<<"\
$MK
$py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 13 ]; then  # one GPU: MoE on the GPU, -O levels, start-up as processes
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/moe/test_fused_moe_gpu.py tests/compile/test_optimization_levels.py
$py -m benchmarks.moe_kernels --tokens 1 8 64 256 1024 4096 --json $R/moe_kernels_h200.json
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 14 ]; then  # one GPU: the FP8 KV cache's tests, then FP8 against bf16 KV
  mapfile -t a <<<"\
$MK
$py -m pytest -q -x -p no:cacheprovider tests/kernels/test_triton_gpu.py tests/worker/test_kv_cache_fp8.py
$py -m benchmarks.kv_cache_fp8 --checkpoint-dir $CK --json $R/kv_cache_fp8_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 15 ]; then  # one GPU: tune the fused MoE for Qwen3-30B-A3B's layer, re-time it
  mapfile -t a <<<"\
$py -m benchmarks.moe_tune --out-dir compiled_llm/moe/configs --json $R/moe_tune_h200.json
cp compiled_llm/moe/configs/*.json $R/moe_tuned_config.json
$py -m benchmarks.moe_kernels --tokens 1 8 64 256 1024 4096 --json $R/moe_kernels_tuned_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 16 ]; then  # one GPU: LoRA and quantized-checkpoint tests, quantized decode
  mapfile -t a <<<"\
$MK
$py -m pytest -q -p no:cacheprovider tests/lora/test_lora_gpu.py tests/quantization/test_gpu.py
$py -m benchmarks.quantized --checkpoint-dir $CK --output-json $R/quantized_h200.json
$py -m benchmarks.lora --checkpoint-dir $CK --skip-plain --reps 1 --output-json $R/lora_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 17 ]; then  # one GPU: spec decode and TP-executor tests, spec and quantized decode
  mapfile -t a <<<"\
$MK
$py -m pytest -q -p no:cacheprovider tests/engine/test_spec_decode.py -k cuda
$py -m pytest -q -p no:cacheprovider -m gpu tests/distributed/test_tp_gpu.py
$py -m benchmarks.spec_decode --checkpoint-dir $CK --configs off ngram draft_self --output-json $R/spec_decode_h200.json
$py -m benchmarks.quantized --checkpoint-dir $CK --output-json $R/quantized_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 18 ]; then  # one GPU: compressed-tensors tests, every quantized path measured
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$py -m pytest -q -p no:cacheprovider tests/quantization/test_gpu.py -k ct_
$py -m benchmarks.quantized --checkpoint-dir $CK --output-json $R/quantized_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 19 ]; then  # one GPU: tune the W4A16 kernel, then W4A16 against bf16, LoRA
  Q=compiled_llm/quantization/configs/w4a16.json
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$py -m pytest -q -x -p no:cacheprovider tests/quantization/test_gpu.py -k 'w4a16_triton or gptq_act_order'
$py -m benchmarks.w4a16_tune --out $Q --output-json $R/w4a16_tune_h200.json; cp $Q $R/w4a16_tuned.json
$py -m benchmarks.quantized --checkpoint-dir $CK --formats bf16 w4a16 --output-json $R/quantized_w4a16_h200.json
$py -m benchmarks.lora --checkpoint-dir $CK --skip-plain --reps 2 --output-json $R/lora_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 20 ]; then  # one GPU: LoRA, embeddings, the W4A16 GEMV tiles, W4A16 decode
  Q=compiled_llm/quantization/configs/w4a16.json
  mapfile -t a <<<"\
$MK
$py -m benchmarks.lora --checkpoint-dir $CK --skip-plain --reps 2 --output-json $R/lora_h200.json
$py -m benchmarks.embed --files .bench/minilm_files --texts 2048 --reps 2 --output-json $R/embed_h200.json
$py -m benchmarks.w4a16_tune --tokens 1 4 --gemv-only --out $Q --output-json $R/w4a16_gemv_tune_h200.json; cp $Q $R/w4a16_tuned.json
$py -m benchmarks.quantized --checkpoint-dir $CK --formats bf16 w4a16 --skip-user-path --output-json $R/quantized_w4a16_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 21 ]; then  # one GPU: LoRA with grouped deltas, then merged features' tests
  T="$py -m pytest -q -p no:cacheprovider"
  mapfile -t a <<<"\
$MK
$T tests/lora/test_lora_gpu.py
$py -m benchmarks.lora --checkpoint-dir $CK --skip-plain --reps 2 --output-json $R/lora_grouped_h200.json
$T tests/kernels/test_qk_norm_rope_gpu.py tests/passes/test_qk_norm_rope.py tests/kernels/test_triton_gpu.py
$T tests/moe/test_fused_moe_gpu.py tests/moe/test_shared_overlap.py
$T tests/worker/test_cudagraphs_gpu.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 22 ]; then  # one GPU: W4A16's tinygemm and prefill paths, tests then decode
  T="$py -m pytest -q -p no:cacheprovider tests/quantization/test_tinygemm.py"
  mapfile -t a <<<"\
$T -k 'cuda_tinygemm or dequantize'
$MK
$py -m benchmarks.quantized --checkpoint-dir $CK --formats w4a16 --skip-user-path --output-json $R/quantized_tinygemm_h200.json
$T -k 'engine and ct_W4A16'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 23 ]; then  # one GPU: where the device time goes (profiles), QK-norm fusion
  P="$py -m benchmarks.profile_steps --json $R/profile_steps_h200.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$P --model $CK/qwen3-0.6b --workload nano-vllm
$P --model $CK/qwen3-0.6b --workload decode
$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b llama3-8b --json $R/qk_norm_rope_h200.json
$MK
$P --model $CK/llama3-8b --workload decode"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 24 ]; then  # one GPU: the one-pass sampler: tests, nano-vllm on and off
  P="$py -m benchmarks.profile_steps --json $R/profile_steps_h200.jsonl"
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -m pytest -q -p no:cacheprovider tests/kernels/gumbel_interpreted_cases.py tests/sample/test_no_host_sync.py tests/engine/test_async_sampling.py -k 'cuda or gumbel or sampler or draws or greedy or bf16'
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $CK/qwen3-0.6b --label default
COMPILED_LLM_ONE_PASS_SAMPLING=0 $U --model $CK/qwen3-0.6b --label default-without-one-pass
$U --model $CK/qwen3-0.6b --label tuned --preset tuned
$P --model $CK/qwen3-0.6b --workload nano-vllm
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$U --model $CK/llama3-8b --label default-8b
$P --model $CK/llama3-8b --workload nano-vllm"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 25 ]; then  # one GPU: tune the small-M GEMM, decode with it and without; the
  # one-pass sampler on the user's path (process core); GPU tests last (carry .whl)
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl"
  G=compiled_llm/gemm/configs/small_m_gemm.json
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; [c.shape_checkpoint(s, \"$CK\", tokenizer=True) for s in (\"qwen3-0.6b\", \"llama3-8b\")]'
$py -m benchmarks.small_m_gemm_tune --shapes qwen3-0.6b.qkv qwen3-0.6b.o qwen3-0.6b.gate_up qwen3-0.6b.down llama3-8b.qkv llama3-8b.o llama3-8b.gate_up llama3-8b.down --tokens 1 2 4 8 16 --block-n 16 32 64 --block-k 128 256 512 --split-k 1 2 4 8 --max-seconds 120 --out $G --output-json $R/small_m_gemm_tune_h200.json; cp $G $R/small_m_gemm.json
$py -m benchmarks.small_m_gemm --checkpoint-dir $CK --shape qwen3-0.6b llama3-8b --json $R/small_m_gemm_h200.json
$U --model $CK/qwen3-0.6b --label default
COMPILED_LLM_ONE_PASS_SAMPLING=0 $U --model $CK/qwen3-0.6b --label default-without-one-pass
$py -m pytest -q -p no:cacheprovider tests/kernels/test_small_m_gemm_gpu.py tests/passes/test_small_m_gemm.py tests/engine/test_async_sampling.py -k 'cuda or small'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 26 ]; then  # one GPU (carry .whl): MoE end to end, then mp against uni
  mapfile -t a <<<"\
$py -m benchmarks.moe_e2e --checkpoint-dir $CK --formats bf16 --output-json $R/moe_e2e_bf16_h200.json
$py -m benchmarks.tp_executor --shape qwen3-0.6b --checkpoint-dir $CK --output-json $R/tp_executor_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 27 ]; then  # one GPU (carry .whl): speculative decoding, every config
  mapfile -t a <<<"\
$MK
$py -m benchmarks.spec_decode --checkpoint-dir $CK --configs off_peaked ngram_peaked draft_self off ngram draft_2layer --output-json $R/spec_decode_h200.json
$py -m pytest -q -p no:cacheprovider tests/engine/test_spec_decode.py tests/engine/test_spec_eagle.py tests/engine/test_spec_medusa.py -k cuda"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 28 ]; then  # one GPU (carry .whl): verify steps in full CUDA graphs
  T="$py -m pytest -q -p no:cacheprovider"
  mapfile -t a <<<"\
$T tests/engine/test_spec_decode.py -k cuda
$MK
$py -m benchmarks.spec_decode --checkpoint-dir $CK --configs off_peaked ngram_peaked --output-json $R/spec_verify_graphs_h200.json
$T tests/engine/test_spec_eagle.py tests/engine/test_spec_eagle3.py tests/worker/test_cudagraphs_gpu.py -k 'cuda or graph'
$T tests/kernels/fused_topk_interpreted_cases.py tests/kernels/gumbel_interpreted_cases.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 29 ]; then  # one GPU (carry .whl .peer): the paired decode benchmarks in both
  # orders, batch 1 against gpt-fast, the tuned user path
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$MK
$py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $CK/qwen3-0.6b --label default
$U --model $CK/qwen3-0.6b --label tuned --preset tuned
$py -m benchmarks.small_m_gemm --checkpoint-dir $CK --shape qwen3-0.6b --batch-sizes 1 8 32 --rounds 2 --json $R/small_m_gemm_rounds_h200.json
$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b --rounds 2 --json $R/qk_norm_rope_rounds_h200.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 31 ]; then  # one GPU (carry .whl .peer): batch 1 against gpt-fast, the
  # default and tuned user path, the fused top-k sampler alone and on the user path, start-up
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl"
  Q=$CK/qwen3-0.6b TP="--sampling '{\"top_p\": 0.95}'"
  mapfile -t a <<<"\
$MK
$py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default --workload decode nano-vllm
$U --model $Q --label tuned --preset tuned
$py -m benchmarks.sampler --json $R/sampler_h200.json
$U --model $Q --label top_p_general $TP
COMPILED_LLM_FUSED_TOPK_SAMPLING=1 $U --model $Q --label top_p_fused $TP
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 32 ]; then  # one GPU (carry .whl): the sampler alone, call 30's serving
  # runs (default, interactivity, offline beside), then start-up as whole processes
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" SIZES="--num-prompts 1024"
  SERVE="$CLI bench serve --port 8100 $SIZES --random-input-len 512 --random-output-len 256 --max-concurrency 256 --ignore-eos --temperature 1.0 --num-client-processes 4 --ready-check-timeout-sec 120 --result-dir $R --result-filename serve_default.json"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m pytest -q -p no:cacheprovider tests/kernels/fused_topk_interpreted_cases.py
$py -m benchmarks.sampler --json $R/sampler_h200.json
$CLI bench throughput --model $Q $SIZES --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$CLI serve --model $Q --port 8100 --log-level warning & s=\$!; $SERVE; r=\$?; kill \$s; wait \$s; exit \$r
$CLI serve --model $Q --port 8100 --log-level warning --performance-mode interactivity & s=\$!; ${SERVE/serve_default.json/serve_interactivity.json}; r=\$?; kill \$s; wait \$s; exit \$r
$py -X importtime -c 'import compiled_llm.engine.core, compiled_llm.compile' 2> $R/importtime_core.txt; sort -t'|' -k2 -n $R/importtime_core.txt | tail -25
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json
COMPILED_LLM_FUSED_TOPK_SAMPLING=1 $py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl --model $Q --label top_p_fused --sampling '{\"top_p\": 0.95}'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 33 ] || [ "$CALL" = 34 ]; then  # one GPU (carry .whl): call 30's serving runs
  # (default and interactivity, offline beside), 8B start-up as whole processes, then a batch-1
  # decode profile (33) or the QK-norm + RoPE + KV-write pair on Qwen3-0.6B (34)
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" SIZES="--num-prompts 1024"
  SERVE="$CLI bench serve --port 8100 $SIZES --random-input-len 512 --random-output-len 256 --max-concurrency 256 --ignore-eos --temperature 1.0 --num-client-processes 4 --ready-check-timeout-sec 120 --result-dir $R --result-filename serve_default.json"
  LAST="$py -m benchmarks.profile_steps --model $Q --workload decode --json $R/profile_decode_qwen3-0.6b.jsonl"
  [ "$CALL" = 34 ] && LAST="$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b --rounds 2 --json $R/qk_norm_rope_qwen3-0.6b.json"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q $SIZES --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$CLI serve --model $Q --port 8100 --log-level warning & s=\$!; $SERVE; r=\$?; kill \$s; wait \$s; exit \$r
$CLI serve --model $Q --port 8100 --log-level warning --performance-mode interactivity & s=\$!; ${SERVE/serve_default.json/serve_interactivity.json}; r=\$?; kill \$s; wait \$s; exit \$r
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json
$LAST"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 35 ]; then  # one GPU: GPU tests of the one-launch split-K GEMM, the one-launch
  # split decode attention and the gated small-M GEMM; batch-1 decode with them and without
  # (same call), the QK-norm pair, a batch-1 profile, then Llama-3-8B batch 1
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/kernels/test_small_m_gemm_gpu.py tests/kernels/test_triton_gpu.py tests/worker/test_cudagraphs_gpu.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label one_launch
COMPILED_LLM_ONE_LAUNCH_SPLITS=0 $U --model $Q --label two_launch --engine-args '{\"passes\": {\"enable_silu_mul_small_m\": false}}'
$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b --json $R/qk_norm_rope_qwen3-0.6b.json
$py -m benchmarks.profile_steps --model $Q --workload decode --json $R/profile_decode_qwen3-0.6b.jsonl
$MK
$U --model $CK/llama3-8b --label one_launch --skip-tokenizer-init"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 36 ]; then  # one GPU (carry .whl .peer): serving's ITL tail with the
  # start-up heap frozen (the default) and not, the collections logged, 8 client processes;
  # offline beside; 8B start-up (args at spawn); Llama-3-8B batch 1 against gpt-fast
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=15
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$ON 2> $R/serve_frozen.log & s=\$!; $SERVE; r=\$?; kill \$s; wait \$s; $GAPS $R/serve_frozen.json --log $R/serve_frozen.log; exit \$r
COMPILED_LLM_GC_FREEZE=0 $ON 2> $R/serve_unfrozen.log & s=\$!; ${SERVE/serve_frozen.json/serve_unfrozen.json}; r=\$?; kill \$s; wait \$s; $GAPS $R/serve_unfrozen.json --log $R/serve_unfrozen.log; exit \$r
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json
$py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 37 ]; then  # one GPU (carry .whl): where serving's slow gaps come from:
  # collections and slow steps logged beside the gaps, with 4 API servers (default), 8 and the
  # prefill cap (max_decode_slowdown 2.5); offline beside; the pinned weight reader (8B)
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli"
  LOGS="COMPILED_LLM_GC_DEBUG=1 COMPILED_LLM_STEP_DEBUG=15"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$(served default "$LOGS")
$(served api8 "$LOGS" --api-server-count 8)
$(served slowdown "$LOGS" --max-decode-slowdown 2.5)
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_weight_reader.py
$MK
$py -m benchmarks.load_weights --checkpoint-dir $CK/llama3-8b --json $R/load_weights_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 38 ]; then  # one GPU (carry .whl): serving with the prefill cap
  # (max_decode_slowdown 2.5, the serve default when this ran), offline beside, 2.0 and off
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=15
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$(served default $LOGS --max-decode-slowdown 2.5)
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$(served slowdown2 $LOGS --max-decode-slowdown 2.0)
$(served uncapped $LOGS --max-decode-slowdown 0)"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 42 ]; then  # one GPU (carry .whl): a mixed step's decodes on the decode
  # kernel: its GPU test, served at 2048-token steps (graphs to 2048), offline, served default,
  # the nano-vllm user path
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=15
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m pytest -q -x -p no:cacheprovider tests/kernels/test_triton_gpu.py -k mixed
$(served budget2048 $LOGS --max-num-batched-tokens 2048 --max-cudagraph-capture-size 2048)
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$(served default $LOGS)
$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl --model $Q --label default"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 43 ]; then  # one GPU (carry .whl): 8B start-up as whole processes with the
  # early load (and serve without it), then the serving workload offline at serve's defaults,
  # profiled, with a mixed step's decodes on the decode kernel and off (as call 44)
  Q=$CK/qwen3-0.6b E='{"max_num_batched_tokens": 2048, "max_cudagraph_capture_size": 2048}'
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-env COMPILED_LLM_EARLY_LOAD=0
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m benchmarks.profile_steps --model $Q --workload serve-like --json $R/profile_serve_on.json --engine-args '$E'
COMPILED_LLM_MIXED_DECODES=0 $py -m benchmarks.profile_steps --model $Q --workload serve-like --json $R/profile_serve_off.json --engine-args '$E'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 44 ]; then  # one GPU: where a served step's time goes, the serving workload
  # offline at serve's defaults (2048-token steps, graphs to 2048), mixed decodes on and off
  Q=$CK/qwen3-0.6b E='{"max_num_batched_tokens": 2048, "max_cudagraph_capture_size": 2048}'
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m benchmarks.profile_steps --model $Q --workload serve-like --json $R/profile_serve_on.json --engine-args '$E'
COMPILED_LLM_MIXED_DECODES=0 $py -m benchmarks.profile_steps --model $Q --workload serve-like --json $R/profile_serve_off.json --engine-args '$E'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 65 ]; then  # one GPU (carry .whl): decode attention with a split per 256
  # keys of context (one split writes the output) and the merge by the last split: GPU tests,
  # the split sweep, batch 1 against the fixed grid (and each change alone), a profile
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  OLD="COMPILED_LLM_DECODE_SPLIT_KEYS=0 COMPILED_LLM_DECODE_MERGE_IN_LAUNCH=0"
  mapfile -t a <<<"\
timeout 150 $py -m pytest -q -p no:cacheprovider tests/kernels/test_triton_gpu.py tests/kernels/test_decode_qk_gpu.py tests/worker/test_cudagraphs_gpu.py tests/worker/test_kv_cache_fp8.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$OLD $U --model $Q --label fixed_grid
COMPILED_LLM_DECODE_MERGE_IN_LAUNCH=0 $U --model $Q --label merge_kernel
COMPILED_LLM_DECODE_SPLIT_KEYS=512 $U --model $Q --label split_keys_512
$OLD $U --model $Q --label fixed_grid
$U --model $Q --label default
timeout 100 $py -m benchmarks.attention_kernels --split-sweep --json $R/decode_splits.json
$py -m benchmarks.profile_steps --model $Q --workload decode --decode-tokens 128 --json $R/profile_decode.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 84 ]; then  # one GPU (carry .whl, compressed-tensors in it): the quantized
  # GPU tests (every packed kind compiled with CUDA graphs against its dequantized twin, the
  # W4A16 kernels at the 8B shapes) and the W4A16 GEMV tests
  mapfile -t a <<<"\
$py -m pytest -q -p no:cacheprovider tests/quantization/test_gpu.py tests/quantization/test_w4a16_gemv_gpu.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 89 ]; then  # one GPU: issue 19's figures in one call, the user's path
  # (LLM(model=DIR) defaults) of Llama-3-8B in bf16, W4A16 and block FP8: decode at batch 1
  # and 64, the nano-vllm workload (SUITE_SECONDS=585 gives the three engines room)
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$py -m benchmarks.quantized --checkpoint-dir $CK --skip-windows --batch-sizes 1 64 --output-json $R/quantized_user_path.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 98 ]; then  # one GPU (carry .whl .peer): issue 14's targets on main in one
  # call: Llama-3-8B batch 1 against gpt-fast, Qwen3-0.6B batch 1, then the 8B cold compile
  # and two warm serves (spawn to first token)
  mapfile -t a <<<"\
$MK
timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py benchmarks/user_path.py --workload decode --json $R/user_path_decode.jsonl --model $CK/qwen3-0.6b --label default
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --serve-only --json $R/startup_serve.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 99 ]; then  # one GPU (carry .whl; after 98 on a warm machine): the fused
  # layer against the unfused one at batch 1/8/32 (both shapes), then issue 13's user path:
  # Qwen3-0.6B nano-vllm default and tuned, Llama-3-8B nano-vllm default
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_nano.jsonl"
  mapfile -t a <<<"\
$MK
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
timeout 240 $py -m benchmarks.horizontal_gemm --checkpoint-dir $CK --json $R/horizontal_gemm.json
$U --model $CK/qwen3-0.6b --label default
$U --model $CK/qwen3-0.6b --label tuned --preset tuned
$U --model $CK/llama3-8b --label default"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 100 ]; then  # one GPU (carry .whl): where a warm 8B serve's API servers
  # spend their start (their timeline line: imports done, spec arrived; the tokenizer phase),
  # the API-server stack's imports alone under -X importtime (bytecode cache as serve sets it)
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --serve-only --serve-env X=1 X=1 --json $R/startup_serve.json
$py -X importtime -c 'import compiled_llm.entrypoints.server.api_server as a; a._import_server_stack()' 2> $R/importtime_api_server.txt
$py -X importtime -c 'import compiled_llm.entrypoints.server.api_server as a; a._import_server_stack()' 2> $R/importtime_api_server2.txt"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 102 ] || [ "$CALL" = 104 ]; then  # one GPU (carry .whl .peer): the L2
  # weight prefetch: Llama-3-8B batch 1 on the user path with it off and on, one process each;
  # against gpt-fast (ours at the tree's defaults); the microbenchmark; its GPU tests. 102:
  # the off/on pairs first (ABAB); 104, for a short device budget: a pair (on, off) before
  # gpt-fast and one after it
  U="$py benchmarks/user_path.py --workload decode --json $R/user_path_decode.jsonl --model $CK/llama3-8b --skip-tokenizer-init"
  OFF='{"passes": {"enable_l2_weight_prefetch": false}}' ON='{"passes": {"enable_l2_weight_prefetch": true}}'
  PAIR="$U --label prefetch_off --engine-args '$OFF'
$U --label prefetch_on --engine-args '$ON'"
  [ "$CALL" = 104 ] && PAIR="$U --label prefetch_on --engine-args '$ON'
$U --label prefetch_off --engine-args '$OFF'"
  GPTFAST="timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json"
  FIRST="$PAIR
$PAIR
$GPTFAST"
  [ "$CALL" = 104 ] && FIRST="$PAIR
$GPTFAST
$PAIR"
  mapfile -t a <<<"\
$MK
$FIRST
timeout 60 $py -m benchmarks.l2_prefetch --idle-us 0 8 --fractions 0.5 0.75 --json $R/l2_prefetch.json
timeout 120 $py -m pytest -q -p no:cacheprovider tests/kernels/test_l2_prefetch_gpu.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 105 ]; then  # one GPU (carry .whl): issue 13's served targets on main:
  # Qwen3-0.6B offline, then served twice at serve's defaults (slow steps logged with their
  # device time), then the nano-vllm user path (default, tuned)
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=12
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_nano.jsonl --model $Q"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$(served default1 $LOGS)
$(served default2 $LOGS)
$U --label default
$U --label tuned --preset tuned"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 111 ]; then  # one GPU (carry .whl): the 8B batch-1 user path with the small-M
  # table's entries for this card against cuBLAS only (enable_small_m_gemm off), ABAB
  U="$py benchmarks/user_path.py --workload decode --json $R/user_path_decode_8b.jsonl --model $CK/llama3-8b"
  OFF='{"passes": {"enable_small_m_gemm": false}}'
  mapfile -t a <<<"\
$MK && $py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$U --label small_m
$U --label cublas --engine-args '$OFF'
$U --label small_m
$U --label cublas --engine-args '$OFF'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 110 ]; then  # one GPU (carry .whl .peer): the encoder and LongRoPE GPU tests;
  # 8B batch 1 against gpt-fast (an H200 only); where the 8B step's device time goes; the 8B
  # layer GEMMs at one token over a wider tile grid than call 25's
  H2="nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0;"
  TUNE="--shapes llama3-8b.qkv llama3-8b.o llama3-8b.down llama3-8b.lm_head --tokens 1 --block-n 16 32 64 128 --block-k 64 128 256 512 --split-k 1 2 4 8 16 --max-seconds 80"
  mapfile -t a <<<"\
timeout 90 $py -m pytest -q -p no:cacheprovider tests/entrypoints/pooling/test_encoders_gpu.py
timeout 90 $py -m pytest -q -p no:cacheprovider tests/models/test_new_archs_gpu.py -k longrope
$MK && $py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$H2 timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
timeout 150 $py -m benchmarks.profile_steps --model $CK/llama3-8b --workload decode --decode-tokens 128 --json $R/profile_decode_llama3-8b.json
timeout 100 $py -m benchmarks.small_m_gemm_tune $TUNE --out $R/tune_8b_table.json --output-json $R/tune_8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 109 ]; then  # one GPU (carry .whl .peer), an H200 only (else nothing runs):
  # issue 14's 8B batch 1 against gpt-fast, then where its step's device time goes
  H2="nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0;"
  mapfile -t a <<<"\
$H2 $MK && $py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$H2 timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$H2 timeout 150 $py -m benchmarks.profile_steps --model $CK/llama3-8b --workload decode --decode-tokens 128 --json $R/profile_decode_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 107 ] || [ "$CALL" = 108 ]; then  # one GPU (carry .whl .peer): new
  # architectures against transformers on CUDA (107: this stop's nine; 108: Gemma 3n and 4);
  # on an H200, issue 14's 8B batch 1 against gpt-fast (108: then 8B nano-vllm, defaults)
  NEW="laguna or granitemoe_swa or hrm_text or axk1 or axk2 or bitnet or diffllama or jetmoe or cohere_compass_linear"
  [ "$CALL" = 108 ] && NEW="gemma3n or gemma4"
  mapfile -t a <<<"\
timeout 300 $py -m pytest -q -p no:cacheprovider tests/models/test_new_archs_gpu.py -k '$NEW'
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0; $MK
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0; timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0; [ "$CALL" = 108 ] || exit 0; $py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)' && timeout 200 $py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_nano.jsonl --model $CK/llama3-8b --label default"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 106 ]; then  # one GPU (carry .whl .peer): the session's new architectures
  # against transformers on CUDA, the harmony parsers and the token-sequence grammar gate; on an
  # H200, issue 14's 8B batch 1 against gpt-fast
  NEW="afmoe or mimo_v2_flash or hyperclovax or hy_v3 or granite_swa or llama4"
  mapfile -t a <<<"\
timeout 240 $py -m pytest -q -p no:cacheprovider tests/models/test_new_archs_gpu.py -k '$NEW'
timeout 120 $py -m pytest -q -p no:cacheprovider tests/sample/test_thinking.py tests/entrypoints/reasoning_parsers/test_harmony.py
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0; $MK
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0; timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 103 ]; then  # one GPU (carry .whl .peer; after 102 on a warm machine):
  # issue 14's batch-1 targets with the prefetch: 8B against gpt-fast, 0.6B default and
  # prefetch off (ABBA), an 8B batch-1 profile
  U="$py benchmarks/user_path.py --workload decode --json $R/user_path_decode.jsonl --model $CK/qwen3-0.6b"
  OFF='{"passes": {"enable_l2_weight_prefetch": false}}'
  mapfile -t a <<<"\
$MK
timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --label default
$U --label prefetch_off --engine-args '$OFF'
$U --label prefetch_off --engine-args '$OFF'
$U --label default
$py -m benchmarks.profile_steps --model $CK/llama3-8b --workload decode --decode-tokens 128 --engine-args '{\"skip_tokenizer_init\": true}' --json $R/profile_decode_8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 101 ]; then  # one GPU: the nano-vllm user path on Qwen3-0.6B, default and
  # tuned in ABBA order (one process each), then Llama-3-8B's default (with its tokenizer)
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_nano.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $CK/qwen3-0.6b --label default
$U --model $CK/qwen3-0.6b --label tuned --preset tuned
$U --model $CK/qwen3-0.6b --label tuned --preset tuned
$U --model $CK/qwen3-0.6b --label default
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$U --model $CK/llama3-8b --label default"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 96 ]; then  # one GPU (carry .whl): Qwen3-0.6B served at serve's defaults
  # with each slow step's device time logged (is a slow gap the device's or the host's?),
  # offline beside, twice; then three warm 8B serves, spawn to first token. First the
  # held-out config tests (head_dim 24 on CUDA: the torch backend picked by auto)
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=12
  mapfile -t a <<<"\
timeout 150 $py -m pytest -q -p no:cacheprovider tests/models/test_heldout_configs.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$(served default1 $LOGS)
$(served default2 $LOGS)
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --serve-only --serve-env X=1 X=1 --json $R/startup_serve.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 93 ]; then  # one GPU (carry .whl): the decode kernels' launch order
  # (longest context first, the default) against the batch order (COMPILED_LLM_DECODE_ORDER=0):
  # the GPU attention and CUDA-graph tests, then Llama-3-8B nano-vllm on the user path, ABBA
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_order.jsonl --model $CK/llama3-8b"
  OFF=COMPILED_LLM_DECODE_ORDER=0
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
timeout 200 $py -m pytest -q -x -p no:cacheprovider tests/kernels/test_decode_qk_gpu.py tests/kernels/test_triton_gpu.py tests/worker/test_cudagraphs_gpu.py
timeout 120 $py -m benchmarks.attention_kernels --mixed-sweep --json $R/decode_order_mixed.json
$U --label ordered
$OFF $U --label batch_order
$OFF $U --label batch_order
$U --label ordered"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 94 ]; then  # one GPU (carry .whl): Qwen3-0.6B nano-vllm on the user
  # path, longest-first launch order against the batch order, ABBAAB
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_order.jsonl --model $CK/qwen3-0.6b"
  OFF=COMPILED_LLM_DECODE_ORDER=0
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --label ordered
$OFF $U --label batch_order
$OFF $U --label batch_order
$U --label ordered
$U --label ordered
$OFF $U --label batch_order"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 95 ]; then  # one GPU (carry .whl; after 93 on a warm machine): Llama-3-8B
  # nano-vllm on the user path, COMPILED_LLM_DECODE_ORDER 0 1 1 0 0 1
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_order_8b.jsonl --model $CK/llama3-8b"
  mapfile -t a < <(for v in 0 1 1 0 0 1; do echo "COMPILED_LLM_DECODE_ORDER=$v $U --label order$v"; done)
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 92 ]; then  # one GPU (carry .whl): block FP8 with its one-launch
  # activation quantization: GPU tests, the GEMMs alone against cuBLAS's block-scaled
  # _scaled_mm and bf16, then the user's path of Llama-3-8B in bf16 and block FP8
  Q="$py -m benchmarks.quantized --checkpoint-dir $CK --skip-windows --batch-sizes 1 64"
  mapfile -t a <<<"\
timeout 70 $py -m pytest -q -p no:cacheprovider tests/quantization/test_gpu.py -k 'block_fp8 or group_quant or fp8_block'
timeout 100 $py -m benchmarks.fp8_block_gemm --tokens 1 64 8192 --json $R/fp8_block_gemm.json
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
$Q --formats bf16 fp8-block --output-json $R/quantized_fp8_block.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 91 ]; then  # one GPU (carry .whl; after call 90 on a warm machine, or it
  # makes the 8B checkpoint): FP8 against bf16 KV cache, decode windows at 64 and 256
  # sequences, then the nano-vllm user path with kv_cache_dtype fp8, auto, fp8
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_kv.jsonl --model $CK/llama3-8b"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
timeout 200 $py -m benchmarks.kv_cache_fp8 --checkpoint-dir $CK --json $R/kv_cache_fp8.json
$U --label fp8kv --engine-args '{\"kv_cache_dtype\": \"fp8\"}'
$U --label auto
$U --label fp8kv --engine-args '{\"kv_cache_dtype\": \"fp8\"}'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 90 ]; then  # one GPU (carry .whl): the GPU attention tests, then the
  # Llama-3-8B half of call 83: the nano-vllm user path with 128-key decode tiles (default)
  # against 64 (COMPILED_LLM_DECODE_BLOCK_N=64) in ABBA order, then 128-key tiles split per
  # 1,024 keys of context (COMPILED_LLM_DECODE_SPLIT_KEYS=1024, opt-in)
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl --model $CK/llama3-8b"
  OLD=COMPILED_LLM_DECODE_BLOCK_N=64
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True)'
timeout 150 $py -m pytest -q -x -p no:cacheprovider tests/kernels/test_triton_gpu.py tests/kernels/test_decode_qk_gpu.py
$U --label tiles128
$OLD $U --label tiles64
$OLD $U --label tiles64
$U --label tiles128
COMPILED_LLM_DECODE_SPLIT_KEYS=1024 $U --label tiles128_split1024"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 83 ]; then  # one GPU (carry .whl): the GPU attention tests, then the
  # nano-vllm user path of Llama-3-8B and Qwen3-0.6B with the decode's batched 128-key tiles
  # (default) and with 64-key tiles at every batch (COMPILED_LLM_DECODE_BLOCK_N=64), in turn
  U="$py benchmarks/user_path.py --workload nano-vllm --json $R/user_path_h200.jsonl"
  OLD=COMPILED_LLM_DECODE_BLOCK_N=64
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"llama3-8b\", \"$CK\", tokenizer=True); c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
timeout 150 $py -m pytest -q -x -p no:cacheprovider tests/kernels/test_triton_gpu.py tests/kernels/test_decode_qk_gpu.py
$U --model $CK/llama3-8b --label tiles128
$OLD $U --model $CK/llama3-8b --label tiles64
$U --model $CK/qwen3-0.6b --label tiles128
$OLD $U --model $CK/qwen3-0.6b --label tiles64
$U --model $CK/llama3-8b --label tiles128
$OLD $U --model $CK/llama3-8b --label tiles64"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 82 ]; then  # one GPU (carry .whl): warm 8B serves with the warm-start hint
  # (default: no compile children started ahead) against the side-by-side pieces off
  # (X=1 repeats the default), then where Llama-3-8B's nano-vllm device time goes
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK"
  OFF=COMPILED_LLM_SIDE_PIECE_COMPILE=0
  mapfile -t a <<<"\
$MK
$S --serve-only --serve-env $OFF X=1 $OFF X=1 --json $R/startup_serve.json
$py -m benchmarks.profile_steps --model $CK/llama3-8b --workload nano-vllm --json $R/profile_nano_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 81 ]; then  # one GPU (carry .whl): the 8B cold compile with its pieces
  # compiled in three warm compile children (default) and in the process
  # (COMPILED_LLM_SIDE_PIECE_COMPILE=0), interleaved after a first process; warm serves with
  # (early children started, then stopped) and without; the GPU tests of the precompile
  # children and of the side-by-side pieces
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK"
  OFF=COMPILED_LLM_SIDE_PIECE_COMPILE=0
  mapfile -t a <<<"\
$MK
$(cold_ab side here $OFF)
$S --serve-only --serve-env $OFF COMPILED_LLM_SIDE_PIECE_COMPILE=1 --json $R/startup_serve.json
timeout 240 $py -m pytest -q -x -p no:cacheprovider tests/worker/test_precompile_gpu.py tests/compile/test_side_compile.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 80 ]; then  # one GPU (carry .whl): the 8B cold compile with its weights read
  # beside the compiler's imports (default) and after them (COMPILED_LLM_EARLY_LOAD=0),
  # interleaved after a first process; a cold compile and warm serve; the children's GPU test
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK"
  OFF=COMPILED_LLM_EARLY_LOAD=0
  mapfile -t a <<<"\
$MK
$(cold_ab early after $OFF)
$S --serve-only --json $R/startup_serve.json
timeout 120 $py -m pytest -q -x -p no:cacheprovider tests/worker/test_precompile_gpu.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 79 ]; then  # one GPU (carry .whl): the 8B cold compile with Inductor's
  # compile sidecar started beside Dynamo (its workers forked as the graph reaches the backend)
  # and without, interleaved after a first process that warms the bytecode cache
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --cold-only"
  ON=COMPILED_LLM_EARLY_COMPILE_SIDECAR=1
  mapfile -t a <<<"\
$MK
$S --json $R/startup_cold_first.json
$ON $S --json $R/startup_cold_sidecar1.json
$S --json $R/startup_cold_plain1.json
$ON $S --json $R/startup_cold_sidecar2.json
$S --json $R/startup_cold_plain2.json
$ON $S --json $R/startup_cold_sidecar3.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 78 ]; then  # one GPU (carry .whl): the W4A16 GPU tests (the FMA form of the
  # pairs' zero, the exactness and odd-N tests), then the 8B cold compile three times (the
  # first with the bytecode cache cold) and a warm serve
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK"
  mapfile -t a <<<"\
timeout 240 $py -m pytest -q -p no:cacheprovider tests/quantization/test_gpu.py -k w4a16
$MK
$S --cold-only --json $R/startup_cold1.json
$S --cold-only --json $R/startup_cold2.json
$S --cold-only --json $R/startup_cold3.json
$S --serve-only --json $R/startup_serve.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 77 ]; then  # one GPU (carry .whl): the MMA tiles re-tuned at 16 and 64 tokens
  # for the paired dequantization, then 8B W4A16 decode with that file and with the shipped one
  W=$R/w4a16.json S="$py -m benchmarks.w4a16_small_m --checkpoint-dir $CK --batch-sizes 16 64 --new-tokens 128 --variants tuned"
  mapfile -t a <<<"\
$py -m benchmarks.w4a16_tune --tokens 16 64 --out $W --output-json $R/w4a16_tune_16_64.json
COMPILED_LLM_W4A16_CONFIG=$W $S --output-json $R/w4a16_retuned.json
$S --output-json $R/w4a16_shipped.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 76 ]; then  # one GPU (carry .whl): 8B W4A16 decode at 16 and 64 tokens on the
  # MMA tiles, paired dequantization on, then off (COMPILED_LLM_W4A16_PAIRED=0), bf16 beside
  S="$py -m benchmarks.w4a16_small_m --checkpoint-dir $CK --batch-sizes 16 64 --new-tokens 128"
  mapfile -t a <<<"\
$S --variants tuned bf16 --output-json $R/w4a16_paired.json
COMPILED_LLM_W4A16_PAIRED=0 $S --variants tuned --output-json $R/w4a16_unpaired.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 75 ]; then  # one GPU: the MMA tiles (shipped and built-in) with the paired
  # dequantization and without (COMPILED_LLM_W4A16_PAIRED=0), at 4, 16 and 64 tokens, twice
  T="$py -m benchmarks.w4a16_tune --quick --tokens 4 16 64"
  mapfile -t a <<<"\
$T --out $R/q_on1.json --output-json $R/w4a16_quick_paired1.json
COMPILED_LLM_W4A16_PAIRED=0 $T --out $R/q_off1.json --output-json $R/w4a16_quick_unpaired1.json
COMPILED_LLM_W4A16_PAIRED=0 $T --out $R/q_off2.json --output-json $R/w4a16_quick_unpaired2.json
$T --out $R/q_on2.json --output-json $R/w4a16_quick_paired2.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 74 ]; then  # one GPU (carry .whl): call 73's tune shipped (gate/up on the
  # GEMV at 1 token, on the MMA tiles at 4): 8B decode at 4 and 2 tokens, the shipped choice
  # first, then tinygemm forced, then bf16
  mapfile -t a <<<"\
$py -m benchmarks.w4a16_small_m --checkpoint-dir $CK --variants tuned tinygemm bf16 --batch-sizes 4 2 --new-tokens 128 --output-json $R/w4a16_small_m.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 73 ]; then  # one GPU: the W4A16 MMA tiles' paired dequantization (two nibbles
  # a LOP3, the zero off in the pair): GPU tests, a tune at 1 and 4 tokens against the GEMV and
  # tinygemm (built-in GEMV tiles and one more), then 8B decode: bf16, tinygemm, the tuned
  # file's choice (run from the working tree: carry .whl)
  W=$R/w4a16.json
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/quantization/test_gpu.py -k w4a16
$py -m benchmarks.w4a16_tune --tokens 1 4 --gemv-block-n 32 --gemv-block-k 256 --gemv-warps 4 --out $W --output-json $R/w4a16_tune_mma.json
COMPILED_LLM_W4A16_CONFIG=$W $py -m benchmarks.w4a16_small_m --checkpoint-dir $CK --variants bf16 tinygemm tuned --batch-sizes 1 4 --new-tokens 128 --output-json $R/w4a16_small_m.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 72 ]; then  # one GPU (carry .whl .peer): batch 1 on main with the 8B gate/up
  # epilogue + prologue: Llama-3-8B against gpt-fast in one run, then Qwen3-0.6B's user path
  mapfile -t a <<<"\
$MK
timeout 250 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl --model $CK/qwen3-0.6b --label default"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 71 ]; then  # one GPU (carry .whl): the 8B start-up on main (dry pass with the
  # decodes first, launchers built by the children): cold compile and a warm serve, a second
  # cold compile, the side-by-side compile's GPU test
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK"
  mapfile -t a <<<"\
$MK
$S --serve-only --json $R/startup_serve.json
$S --cold-only --json $R/startup_cold2.json
timeout 120 $py -m pytest -q -x -p no:cacheprovider tests/worker/test_precompile_gpu.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 70 ]; then  # one GPU (carry .whl): the 8B cold compile with each kernel's
  # launcher built by the compile children (default) and at its first launch (as before), in
  # the order new, old, old, new; Llama-3-8B batch 1 with the tuned GATE_UP entries (so its
  # gate/up takes the epilogue and the add + RMSNorm prologue) and with them "unfused",
  # interleaved; the GPU tests of the epilogue and prologue ops under the new table
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --cold-only"
  OLD=COMPILED_LLM_PRECOMPILE_LAUNCHERS=0 OFF=COMPILED_LLM_SMALL_M_GEMM_CONFIG=/tmp/unfused.json
  U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl --model $CK/llama3-8b --skip-tokenizer-init"
  mapfile -t a <<<"\
$MK
$py -c 'import json; json.dump({\"devices\": {\"NVIDIA H200\": {\"gate_up:28672,4096\": {m: \"unfused\" for m in \"1 2 4 8 16\".split()}}}}, open(\"/tmp/unfused.json\", \"w\"))'
$S --json $R/startup_cold_new1.json
$OLD $S --json $R/startup_cold_old1.json
$OLD $S --json $R/startup_cold_old2.json
$S --json $R/startup_cold_new2.json
$U --label gate_up_epilogue
$OFF $U --label gate_up_unfused
$U --label gate_up_epilogue_again
$OFF $U --label gate_up_unfused_again
timeout 100 $py -m pytest -q -x -p no:cacheprovider tests/kernels/test_small_m_norm_gpu.py tests/kernels/test_small_m_gemm_gpu.py -k 'gate_up or norm'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 69 ]; then  # one GPU (carry .whl): the 8B cold compile with Inductor's compile
  # workers started as Dynamo begins (default) and at Inductor's first compile (TORCH_WARM_POOL=0,
  # as before), in the order on, off, off, on; the GATE_UP epilogue tuned for the 8B gate/up
  S="$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --cold-only"
  mapfile -t a <<<"\
$MK
$S --json $R/startup_cold_on1.json
TORCH_WARM_POOL=0 $S --json $R/startup_cold_off1.json
TORCH_WARM_POOL=0 $S --json $R/startup_cold_off2.json
$S --json $R/startup_cold_on2.json
$py -m benchmarks.small_m_gemm_tune --gate-up --shapes llama3-8b.gate_up --tokens 1 2 4 8 16 --margin 0.01 --out $R/small_m_gemm_8b_gate_up.json --output-json $R/small_m_gate_up_tune_8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 68 ]; then  # one GPU (carry .whl): batch 1 on the defaults with the add +
  # RMSNorm prologue on by default: Qwen3-0.6B, then Llama-3-8B
  U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $CK/qwen3-0.6b --label default
$MK
$U --model $CK/llama3-8b --label default --skip-tokenizer-init"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 67 ]; then  # one GPU (carry .whl): the residual add + RMSNorm in the next
  # small-M GEMM's prologue (opt-in pass): its GPU tests, Qwen3-0.6B batch 1 with and without
  # it (interleaved, three each), a profile with it
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  P='{"passes": {"enable_small_m_norm_prologue": true}}'
  mapfile -t a <<<"\
timeout 90 $py -m pytest -q -p no:cacheprovider tests/kernels/test_small_m_norm_gpu.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label norm_prologue --engine-args '$P'
$U --model $Q --label default
$U --model $Q --label default
$U --model $Q --label norm_prologue --engine-args '$P'
$U --model $Q --label norm_prologue --engine-args '$P'
$U --model $Q --label default
$py -m benchmarks.profile_steps --model $Q --workload decode --decode-tokens 128 --engine-args '$P' --json $R/profile_decode.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 66 ]; then  # one GPU (carry .whl .peer): V read with K in decode (GPU tests,
  # batch 1 with and without in both orders, the split sweep), Llama-3-8B batch 1 against
  # gpt-fast in one run, its user path, the EAGLE engine tests. EARLY_V was removed after this
  # call (it changed nothing): its runs are now the defaults
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  EV=COMPILED_LLM_DECODE_EARLY_V=1
  mapfile -t a <<<"\
$EV timeout 100 $py -m pytest -q -p no:cacheprovider tests/kernels/test_triton_gpu.py tests/kernels/test_decode_qk_gpu.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$EV $U --model $Q --label early_v
$MK
timeout 240 $py -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir $CK --peer gptfast --scheduling async --json $R/decode_gptfast_llama3-8b.json
$EV $U --model $Q --label early_v
$U --model $Q --label default
timeout 60 $py -m benchmarks.attention_kernels --split-sweep --json $R/decode_splits.json
$U --model $CK/llama3-8b --label default --skip-tokenizer-init
timeout 100 $py -m pytest -x -q -p no:cacheprovider tests/engine/test_spec_eagle.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 64 ]; then  # one GPU (carry .whl): the one-launch decode with the newest key
  # from registers and the tuned gate/up SiLU·mul epilogue on by default: GPU tests, batch 1
  # (0.6B: defaults twice, each off once; 8B defaults), the QK pair at 1/8/32
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  S='{"passes": {"enable_small_m_silu_mul": false}}'
  mapfile -t a <<<"\
timeout 120 $py -m pytest -q -p no:cacheprovider tests/kernels/test_decode_qk_gpu.py tests/worker/test_cudagraphs_gpu.py tests/worker/test_kv_cache_fp8.py
timeout 60 $py -m pytest -q -p no:cacheprovider tests/kernels/test_small_m_gemm_gpu.py -k 'gate_up or silu'
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$U --model $Q --label silu_mul_epilogue_off --engine-args '$S'
COMPILED_LLM_ONE_LAUNCH_DECODE=0 $U --model $Q --label two_kernel_decode
$MK
$U --model $CK/llama3-8b --label default --skip-tokenizer-init
$U --model $Q --label default
$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b --rounds 1 --json $R/qk_norm_rope.json
timeout 100 $py -m pytest -x -q -p no:cacheprovider tests/engine/test_spec_eagle.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 63 ]; then  # one GPU (carry .whl): the one-launch decode (QK-norm + RoPE + KV
  # write inside split decode): its GPU tests and the engine's graph tests, batch 1 against the
  # two-kernel path in both orders, the pair against the unfused layer at 1/8/32, a profile
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
timeout 240 $py -m pytest -q -p no:cacheprovider tests/kernels/test_decode_qk_gpu.py tests/kernels/test_qk_norm_rope_gpu.py tests/worker/test_cudagraphs_gpu.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label one_launch_decode
COMPILED_LLM_ONE_LAUNCH_DECODE=0 $U --model $Q --label two_kernel_decode
COMPILED_LLM_ONE_LAUNCH_DECODE=0 $U --model $Q --label two_kernel_decode
$U --model $Q --label one_launch_decode
$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b --rounds 2 --json $R/qk_norm_rope.json
$py -m benchmarks.profile_steps --model $Q --workload decode --decode-tokens 128 --json $R/profile_decode.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 62 ]; then  # one GPU (carry .whl): where batch 1's step goes on the defaults:
  # the kernel table and the device timeline's idle gaps, batch 1 with one-launch splits, the
  # EAGLE engine tests (stopped at their first failure)
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m benchmarks.profile_steps --model $Q --workload decode --decode-tokens 128 --json $R/profile_decode.json
$U --model $Q --label default
COMPILED_LLM_ONE_LAUNCH_SPLITS=1 $U --model $Q --label one_launch_splits
timeout 150 $py -m pytest -x -q -p no:cacheprovider tests/engine/test_spec_eagle.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 61 ]; then  # one GPU (carry .whl): the defaults after call 60 (QK-norm +
  # RoPE + KV write fused, the add + norm epilogue): batch 1, then the GPU tests under them
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$MK
$U --model $CK/llama3-8b --label default --skip-tokenizer-init
timeout 170 $py -m pytest -q -p no:cacheprovider tests/kernels/test_qk_norm_rope_gpu.py tests/worker/test_cudagraphs_gpu.py tests/worker/test_kv_cache_fp8.py tests/engine/test_spec_eagle.py tests/lora/test_lora_gpu.py"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 60 ]; then  # one GPU (carry .whl): both epilogues (the defaults) against
  # each off, the QK-norm + RoPE + KV write fusion on top; pairs in both orders
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  S='{"passes": {"enable_small_m_silu_mul": false}}' K='{"passes": {"enable_qk_norm_rope_kv_write": true}}'
  N='{"passes": {"enable_small_m_silu_mul": false, "enable_small_m_add_rms_norm": false}}'
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/kernels/test_small_m_gemm_gpu.py -k add_rms_norm
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$U --model $Q --label silu_mul_epilogue_off --engine-args '$S'
$U --model $Q --label both_epilogues_off --engine-args '$N'
$U --model $Q --label qk_norm_rope_kv_write --engine-args '$K'
$py -m benchmarks.small_m_epilogues --checkpoint-dir $CK --shape qwen3-0.6b --rounds 2 --json $R/small_m_epilogues.json
$py -m benchmarks.qk_norm_rope --checkpoint-dir $CK --shape qwen3-0.6b --rounds 2 --json $R/qk_norm_rope.json
$MK
$U --model $CK/llama3-8b --label default --skip-tokenizer-init"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 59 ]; then  # one GPU (carry .whl): SmallMGemmAddRMSNormFusionPass on (the
  # default) and off; the cold compile after them (the bytecode cache then warm, as in call 55)
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  OFF='{"passes": {"enable_small_m_add_rms_norm": false}}' K='{"passes": {"enable_qk_norm_rope_kv_write": true}}'
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/kernels/test_small_m_gemm_gpu.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$U --model $Q --label add_norm_off --engine-args '$OFF'
$U --model $Q --label default_qk_norm_rope_kv_write --engine-args '$K'
$U --model $Q --label default_again
$U --model $Q --label add_norm_off_again --engine-args '$OFF'
$py -m benchmarks.small_m_epilogues --checkpoint-dir $CK --shape qwen3-0.6b --json $R/small_m_add_rms_norm.json
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only
$U --model $CK/llama3-8b --label default --skip-tokenizer-init"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 58 ]; then  # one GPU: where a cold start's side-by-side compiles wait
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 57 ]; then  # one GPU: COMPILED_LLM_PDL 0, 1, 2 in one call, Qwen3-0.6B then 8B
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label pdl0
COMPILED_LLM_PDL=1 $U --model $Q --label pdl1
COMPILED_LLM_PDL=2 $U --model $Q --label pdl2
$U --model $Q --label pdl0_again
COMPILED_LLM_PDL=1 $U --model $Q --label pdl1_again
$MK
$U --model $CK/llama3-8b --label pdl0 --skip-tokenizer-init
COMPILED_LLM_PDL=1 $U --model $CK/llama3-8b --label pdl1 --skip-tokenizer-init"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 56 ]; then  # one GPU (carry .whl): PDL on (the default) and off, same call
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  K='{"passes": {"enable_qk_norm_rope_kv_write": true}}'
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/kernels/test_small_m_gemm_gpu.py tests/kernels/test_triton_gpu.py tests/kernels/test_qk_norm_rope_gpu.py tests/worker/test_precompile_gpu.py
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label pdl
COMPILED_LLM_PDL=0 $U --model $Q --label no_pdl
$U --model $Q --label pdl_qk_norm_rope_kv_write --engine-args '$K'
$U --model $Q --label pdl_again
COMPILED_LLM_PDL=0 $U --model $Q --label no_pdl_again
$MK
$U --model $CK/llama3-8b --label pdl --skip-tokenizer-init
COMPILED_LLM_PDL=0 $U --model $CK/llama3-8b --label no_pdl --skip-tokenizer-init
$py -m benchmarks.profile_steps --model $Q --workload decode --json $R/profile_decode_qwen3-0.6b.jsonl"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 55 ]; then  # one GPU (carry .whl): the tests warm the bytecode cache first
  Q=$CK/qwen3-0.6b U="$py benchmarks/user_path.py --workload decode --json $R/user_path_h200.jsonl"
  P='{"passes": {"enable_silu_mul_small_m": true}}' K='{"passes": {"enable_qk_norm_rope_kv_write": true}}'
  B='{"passes": {"enable_silu_mul_small_m": true, "enable_qk_norm_rope_kv_write": true}}'
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py tests/worker/test_precompile_gpu.py
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_on.json --serve-only
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$U --model $Q --label default
$U --model $Q --label silu_mul_small_m --engine-args '$P'
$U --model $Q --label qk_norm_rope_kv_write --engine-args '$K'
$U --model $Q --label both --engine-args '$B'
$U --model $Q --label default_again
COMPILED_LLM_PARALLEL_TRITON_COMPILE=0 $py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_off.json --serve-only"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 54 ]; then  # one GPU: the 8B cold compile and a serve, nothing else
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 53 ]; then  # one GPU: the review's fixes (one capture stream for a runner's
  # graphs, compile children fed and drained by threads): graph and precompile GPU tests, then
  # the 8B cold compile and a warm serve
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py tests/worker/test_precompile_gpu.py
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 51 ] || [ "$CALL" = 52 ]; then  # one GPU: a cold start's Triton kernels
  # compiled side by side (precompile.py; 51 ran it on threads, 52 in child processes): its GPU
  # test, then the 8B cold compile and a serve, off, then on
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_precompile_gpu.py
$MK
COMPILED_LLM_PARALLEL_TRITON_COMPILE=0 $py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_off.json --serve-only
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_on.json --serve-only"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 50 ]; then  # one GPU: captures without torch.cuda.graph's cache flush each
  # and API servers without a collection at ready: the graph tests, a cold compile, two serves
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/worker/test_cudagraphs_gpu.py
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only --serve-env COMPILED_LLM_EARLY_LOAD=1"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 49 ]; then  # one GPU: which start-up phase compiles Triton kernels: a cold
  # compile, then two warm serves (the first after a compile captured for 13 s in call 48)
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only --serve-env COMPILED_LLM_EARLY_LOAD=1"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 48 ]; then  # one GPU: warm serve of the 8B shape with the bytecode cache,
  # its weights loaded after the imports (the default) and beside them (early load)
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-only --serve-env COMPILED_LLM_EARLY_LOAD=1 COMPILED_LLM_EARLY_LOAD=0"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 47 ]; then  # one GPU (carry .whl): the bytecode cache: the core's imports
  # (bytecode coverage, a fresh prefix twice), then the 8B start-up, serve with it and without
  mapfile -t a <<<"\
$MK
$py -m benchmarks.import_profile --json $R/import_profile.json --concurrent 5
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-env COMPILED_LLM_BYTECODE_CACHE=0"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 46 ]; then  # one GPU (carry .whl): where a warm serve's seconds go: the 8B
  # start-up with one API server beside the default, the core's imports alone and five at once,
  # then the serving workload offline at serve's defaults, mixed decodes on and off
  Q=$CK/qwen3-0.6b E='{"max_num_batched_tokens": 2048, "max_cudagraph_capture_size": 2048}'
  mapfile -t a <<<"\
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json --serve-env '--api-server-count 1'
$py -m benchmarks.import_profile --json $R/import_profile.json --concurrent 5
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m benchmarks.profile_steps --model $Q --workload serve-like --json $R/profile_serve_on.json --engine-args '$E'
COMPILED_LLM_MIXED_DECODES=0 $py -m benchmarks.profile_steps --model $Q --workload serve-like --json $R/profile_serve_off.json --engine-args '$E'"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 45 ]; then  # one GPU: the W4A16 GEMV (exponent-trick dequantization): its GPU
  # tests, a 1-token tune beside tinygemm, then 8B batch-1 decode: bf16, tinygemm, GEMV
  mapfile -t a <<<"\
$py -m pytest -q -x -p no:cacheprovider tests/quantization/test_w4a16_gemv_gpu.py
$py -m benchmarks.w4a16_tune --gemv-only --tokens 1 --gemv-block-n 16 32 64 --gemv-block-k 256 512 --gemv-warps 4 8 --out $R/w4a16.json --output-json $R/w4a16_tune_gemv.json
$py -m benchmarks.w4a16_small_m --checkpoint-dir $CK --variants bf16 tinygemm gemv --batch-sizes 1 --new-tokens 128 --output-json $R/w4a16_small_m.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 41 ]; then  # one GPU: where a mixed step's time goes, device kernels by
  # kind, the nano-vllm workload at the default token budget and at 1024 (graphs up to it)
  Q=$CK/qwen3-0.6b
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$py -m benchmarks.profile_steps --model $Q --workload nano-vllm --json $R/profile_budget1024.json --engine-args '{\"max_num_batched_tokens\": 1024, \"max_cudagraph_capture_size\": 1024}'
$py -m benchmarks.profile_steps --model $Q --workload nano-vllm --json $R/profile_default.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 40 ]; then  # one GPU (carry .whl): the token budget of a served step at
  # 1024 / 1536 / 2048 with piecewise graphs up to it, offline beside
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=15
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$(served budget2048 $LOGS --max-num-batched-tokens 2048 --max-cudagraph-capture-size 2048)
$(served budget1024 $LOGS --max-num-batched-tokens 1024 --max-cudagraph-capture-size 1024)
$(served budget1536 $LOGS --max-num-batched-tokens 1536 --max-cudagraph-capture-size 2048)
$(served interactivity2048 $LOGS --performance-mode interactivity --max-cudagraph-capture-size 2048)"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 39 ]; then  # one GPU (carry .whl): steps of more than 512 tokens in
  # piecewise CUDA graphs (--max-cudagraph-capture-size 2048 / 4096), served with and without
  # the prefill cap, offline beside; then the 8B start-up with the pinned weight reader
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" LOGS=COMPILED_LLM_STEP_DEBUG=15
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q --num-prompts 1024 --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$(served graphs2048_cap $LOGS --max-cudagraph-capture-size 2048 --max-decode-slowdown 2.5)
$(served interactivity2048 $LOGS --performance-mode interactivity --max-cudagraph-capture-size 2048)
$(served graphs4096_cap $LOGS --max-cudagraph-capture-size 4096 --max-decode-slowdown 2.5)
$MK
$py -m benchmarks.startup --shape llama3-8b --checkpoint-dir $CK --json $R/startup_llama3-8b.json"
  stream 0 "gpu0_call$CALL" "${a[@]}"
elif [ "$CALL" = 30 ]; then  # one GPU (carry .whl): call 7's serving workload, the default
  # against --performance-mode interactivity (2048-token steps: shorter steps where prefill
  # chunks join the decodes), offline throughput beside
  Q=$CK/qwen3-0.6b CLI="$py -m compiled_llm.entrypoints.cli" SIZES="--num-prompts 1024"
  SERVE="$CLI bench serve --port 8100 $SIZES --random-input-len 512 --random-output-len 256 --max-concurrency 256 --ignore-eos --temperature 1.0 --num-client-processes 4 --ready-check-timeout-sec 120 --result-dir $R --result-filename serve_default.json"
  mapfile -t a <<<"\
$py -c 'import benchmarks.common as c; c.shape_checkpoint(\"qwen3-0.6b\", \"$CK\", tokenizer=True)'
$CLI bench throughput --model $Q $SIZES --input-len 512 --output-len 256 --output-json $R/throughput_default.json
$CLI serve --model $Q --port 8100 --log-level warning & s=\$!; $SERVE; r=\$?; kill \$s; wait \$s; exit \$r
$CLI serve --model $Q --port 8100 --log-level warning --performance-mode interactivity & s=\$!; ${SERVE/serve_default.json/serve_interactivity.json}; r=\$?; kill \$s; wait \$s; exit \$r"
  stream 0 "gpu0_call$CALL" "${a[@]}"
else
  run_streams "\
$MK
$py -m benchmarks.compile_bench --shape llama3-8b --checkpoint-dir $CK/llama3-8b --max-model-len 4096 --phases speed --speed-modes stock backend backend+cudagraphs --profile-dir $J --json $J/compile_speed_llama3-8b.json" "\
$py -m benchmarks.prefill --checkpoint-dir $CK --json $J/prefill.json"
fi
cp /tmp/suite/*.log "$R"/
tar czf "$R/results_call$CALL.tgz" -C /tmp/suite res
