#!/bin/sh
# The x86 fast forms of a git ref (default HEAD) against this tree's, in one process, interleaved
# (tools/native_ab.cc): PackedAttention and QMatMulGGML at the coder's shapes, one thread;
# `qmatmul`: QMatMul4/8 at the coder draft's shapes; `attention-forms`: this tree's VNNI against
# its AVX2 PackedAttention; `avxvnni`: this tree's AVX2 and VNNI forms against its AVX-VNNI form
# (EVEX encoding: an AVX-512 VL + VNNI host) at QMatMul4's draft and target shapes and QMatMulGGML's
# Q4_K / Q6_K (REF unused).
#   tools/native_ab.sh [REF] [attention|ggml|all|forms|qmatmul|attention-forms|avxvnni] [REPS] [ROWS, e.g. 1,2,4,5,9,17]     (after `make kernels`; a timing: under
#   flock /work/heavy.lock on a shared host)
set -eu
ref=${1:-HEAD}
what=${2:-all}
reps=${3:-21}
out=.cache/native_ab
rm -rf "$out" && mkdir -p "$out/src"
git archive "$ref" native | tar -x -C "$out/src"
flags="-O3 -std=c++17 -fPIC -fvisibility=hidden -ffp-contract=off -I.cache/onnxruntime-1.21/usr/include/onnxruntime"
rename="-Dattend_avx2=attend_avx2_before -Dattend_avx512=attend_avx512_before -Dggml_avx2=ggml_avx2_before -Dggml_vnni=ggml_vnni_before -Dmatmul_avx2=matmul_avx2_before -Dquantize_avx2=quantize_avx2_before"
avx512="-mavx512f -mavx512bw -mavx512vnni -mamx-tile -mamx-int8 -w"
avx2="-mavx2 -mfma -mf16c"
for f in attention_x86 qmatmul_ggml_x86; do g++ $flags $avx512 $rename -c "$out/src/native/$f.cc" -o "$out/$f.o"; done
for f in attention_avx2 qmatmul_ggml_avx2 qmatmul_avx2; do g++ $flags $avx2 $rename -c "$out/src/native/$f.cc" -o "$out/$f.o"; done
k=${NATIVE_AB_AFTER:-.cache/kernels}  # the objects of "after" (default: this tree's build)
g++ -O2 -std=c++17 -Inative tools/native_ab.cc "$out"/*.o $k/attention_ref.o $k/qmatmul_ref.o $k/qmatmul_ggml_ref.o \
  $k/attention_x86.o $k/attention_avx2.o $k/qmatmul_ggml_x86.o $k/qmatmul_ggml_avx2.o $k/qmatmul_x86.o $k/qmatmul_avx2.o $k/qmatmul_avxvnni_evex.o $k/qmatmul_ggml_avxvnni_evex.o \
  -o "$out/native_ab"
echo "before: $(git rev-parse --short "$ref"), after: this tree; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
"$out/native_ab" "$what" "$reps" ${4:+"$4"}
