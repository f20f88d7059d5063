"""A llama.cpp service reads its tokenizer in a child process and keeps transformers' model code out of its
memory; the description it publishes is the one the torch services and the orchestrator compute in process
(their fingerprints must match for the pair check)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdec.models.load_config import load_config
from specdec.models.loader import load_tokenizer
from specdec.models.spec import ModelLoadError, parse_model_spec
from specdec.models.tokenizer_apart import describe_apart
from specdec.models.tokenizer_info import describe_tokenizer

pytestmark = pytest.mark.slow


def test_the_childs_description_equals_the_in_process_one():
    in_process = describe_tokenizer(
        load_tokenizer(parse_model_spec("embedded"), load_config("cpu", "auto", None, True))
    )
    assert describe_apart("embedded", None, offline=True) == in_process


def test_a_model_that_cannot_be_read_is_a_one_line_load_error():
    with pytest.raises(ModelLoadError, match=r"cannot read the tokenizer of /nonexistent/model.gguf: .*"):
        describe_apart("/nonexistent/model.gguf", None, offline=True)


def test_a_llamacpp_target_loads_without_transformers_model_code():
    probe = (
        "import sys\n"
        "from specdec.config import ModelServiceConfig\n"
        "from specdec.engine.loading import load_target\n"
        "bundle = load_target(ModelServiceConfig(role='target', model='embedded', device='cpu', dtype='auto', "
        "engine='llamacpp', threads=1))\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('sympy', 'transformers.models', 'torch.distributed.tensor')))\n"
        "print(bundle.engine, len(heavy), heavy[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[:2] == ["llamacpp", "0"], done.stdout
