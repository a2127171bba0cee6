# The GPU environment for Slurm jobs without containers: the trainer image's Python set (sglang, CUDA torch, verl)
# as a virtual environment on the shared filesystem, with the image's pins (deploy/slurm/venv-gpu.py).
# docs/multi-node.md ("GPU environment") has the container alternative (Apptainer, enroot/pyxis).
GPU_VENV ?= .venv-gpu-$(VERL_LINE)

.PHONY: venv-gpu venv-gpu-check
venv-gpu: ## the pinned GPU venv for Slurm (VERL_LINE=0.9|0.7: sglang, CUDA torch, verl as in the trainer image) in GPU_VENV
	$(PYTHON) deploy/slurm/venv-gpu.py --line $(VERL_LINE) --venv $(GPU_VENV) --python $(PYTHON)

venv-gpu-check: ## resolve venv-gpu's install against the package index without installing (pip --dry-run --report), and its test
	$(PY) deploy/slurm/venv-gpu.py --line $(VERL_LINE) --dry-run
	AGENTRL_TEST_VENV_GPU=1 $(VENV)/bin/pytest -q tests/deploy/test_venv_gpu.py
