#!/usr/bin/env bash
# Measures, in one run on this machine, one core each: exec/gemm against
# OpenBLAS's sgemm (its default kernels and its AVX-512 ones), and the
# executor's tiny-gpt2 step against PyTorch's. Needs Debian's
# libopenblas-dev and python3-torch (apt-get install libopenblas-dev python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -o "$tmp/sgemm" bench/sgemm.c -lopenblas
OPENBLAS_NUM_THREADS=1 "$tmp/sgemm" | sed 's/^/default   /'
OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=SkylakeX "$tmp/sgemm" | sed 's/^/SkylakeX  /'
go test -run XXX -bench 'Sgemm512x512x2048/.*/NN' -cpu 1 -count 3 ./exec/gemm | grep -E '^Benchmark'
/usr/bin/python3 bench/torch_step.py 300
go test -run XXX -bench 'StepTinyGPT2' -cpu 1 -count 3 ./exec | grep -E '^Benchmark'
