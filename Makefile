# rope-tutor: one command builds the website, one runs every test.
#   make book   - set up .venv, execute every notebook, build the HTML site into _build/html
#   make test   - set up .venv, then ruff + pytest (unit tests, nbval on every notebook, site checks)
#   make lab    - JupyterLab in the same environment, opened at book/
#   make execute NB=book/03_sinusoidal.ipynb - re-run one notebook and store its outputs in place

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.rope-tutor-installed
JB_FLAGS := --builder html -W -n --keep-going

.PHONY: book test lab execute lint clean browser

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . $(JB_FLAGS)
	@echo "The book is built: open _build/html/index.html in a browser (works offline)."

# The browser test (tests/test_browser.py) drives Debian's Chromium through its ChromeDriver (the
# browser downloads of automation libraries do not work offline). Installed once, as root or via sudo.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	  else echo "make test needs Debian's chromium and chromium-driver packages: install them as root" >&2; exit 1; fi; \
	  $$SUDO apt-get update -q && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

test: $(STAMP) browser
	$(BIN)/ruff check rope_tutor tests book
	$(BIN)/python -m pytest

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=book

execute: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make execute NB=book/<chapter>.ipynb" && exit 2)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 \
		--ExecutePreprocessor.record_timing=False "$(NB)"

lint: $(STAMP)
	$(BIN)/ruff check rope_tutor tests book

clean:
	rm -rf _build
