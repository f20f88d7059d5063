"""The in-process anchors of the benchmark, and the verify-cost measurement behind the bound.

(c) ``hf_target``: Hugging Face ``generate`` with the target alone, greedy.
(d) ``hf_assisted``: Hugging Face assisted generation with the same kind of draft as the stack:
    ``prompt_lookup_num_tokens=`` for the n-gram draft, ``assistant_model=`` for a model draft.
    Its settings are fixed here (:class:`HFSettings`) and written into the JSON.

Both run in the bench process with the same model weights (``load_causal_lm``), dtype and
thread count as the target service, on the same token ids as the stack (the chat template is
applied by :class:`orchestrator.prompting.Prompter`, exactly as the orchestrator does).
EOS is treated as an ordinary token (the generation config has no EOS), like ``ignore_eos``
in the stack, so every configuration generates exactly ``max_new_tokens`` tokens.

:func:`verify_costs` measures v(n), the time of one target forward over n new tokens on top
of a warm KV cache, relative to n = 1: the denominator of the bound in the plot.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specdec.bench.verify_cost import measure_verify_costs
from specdec.params import MODEL_DRAFT_KINDS


@dataclass
class HFSettings:
    """Assisted-generation settings of (d); fixed for a run and recorded in the JSON."""

    draft_kind: str = "ngram"
    # n-gram draft (PromptLookupCandidateGenerator): a constant number of tokens, no schedule
    prompt_lookup_num_tokens: int = 10  # the value of the transformers documentation
    max_matching_ngram_size: int = 2  # transformers' default
    # model draft (AssistedCandidateGenerator)
    assistant_model: str = ""
    num_assistant_tokens: int = 20  # transformers' defaults
    num_assistant_tokens_schedule: str = "constant"
    assistant_confidence_threshold: float = 0.4

    def generate_kwargs(self) -> dict[str, Any]:
        if self.draft_kind == "ngram":
            return {
                "prompt_lookup_num_tokens": self.prompt_lookup_num_tokens,
                "max_matching_ngram_size": self.max_matching_ngram_size,
            }
        return {
            "num_assistant_tokens": self.num_assistant_tokens,
            "num_assistant_tokens_schedule": self.num_assistant_tokens_schedule,
            "assistant_confidence_threshold": self.assistant_confidence_threshold,
        }

    def record(self) -> dict[str, Any]:
        """What the JSON shows: only the settings that apply to this draft kind."""
        keys = (
            ("draft_kind", "prompt_lookup_num_tokens", "max_matching_ngram_size")
            if self.draft_kind == "ngram"
            else (
                "draft_kind",
                "assistant_model",
                "num_assistant_tokens",
                "num_assistant_tokens_schedule",
                "assistant_confidence_threshold",
            )
        )
        return {k: v for k, v in asdict(self).items() if k in keys}


class TimingStreamer:
    """A transformers streamer that timestamps every batch of new tokens it is handed."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        self.times.append(now)
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        pass


@dataclass
class HFRun:
    token_ids: list[int]
    wall_s: float
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, tokens)


class HFBaselines:
    """The target (and a draft model, if any) loaded in this process."""

    def __init__(self, target_model: str, threads: int, settings: HFSettings, dtype: str = "float32") -> None:
        from specdec.engine.torch_loading import quantize_weights, weight_quantization
        from specdec.models.loader import LoadConfig, load_causal_lm

        self.threads = threads
        self.settings = settings
        quant = weight_quantization(dtype)  # the same int8 / int4 linears as the services (HF runs that target too)
        # The services' device ("auto": CUDA when present); the int8 / int4 linears are CPU kernels.
        cfg = LoadConfig(device="cpu" if quant else "auto", dtype="float32" if quant else dtype, threads=threads)
        torch.set_num_threads(threads)
        loaded = load_causal_lm(target_model, cfg)
        if quant:
            quantize_weights(loaded.model, quant)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.model_id = loaded.model_id
        self.assistant = None
        self.can_assist = True
        if settings.draft_kind in MODEL_DRAFT_KINDS:  # combined: its model part is the HF assistant
            from specdec.models.feature_draft import FeatureDraftModel

            self.assistant = load_causal_lm(settings.assistant_model, cfg).model
            if isinstance(self.assistant, FeatureDraftModel):  # fed the target's hidden states: not an HF assistant
                self.assistant, self.can_assist = None, False
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        # No EOS: generate always runs to max_new_tokens (the stack's ignore_eos).
        self.gen_config = copy.deepcopy(self.model.generation_config)
        self.gen_config.eos_token_id = None
        self.gen_config.pad_token_id = pad
        self.gen_config.do_sample = False
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            if hasattr(self.gen_config, name):
                setattr(self.gen_config, name, None)
        self.dtype = quant or str(next(self.model.parameters()).dtype).removeprefix("torch.")

    def chat_ids(self, user: str) -> list[int]:
        """The ids the orchestrator sends for one user message (same Prompter)."""
        from orchestrator.prompting import Message, Prompter

        return Prompter(self.tokenizer).first_turn([Message("user", user)], add_generation_prompt=True)

    @torch.inference_mode()
    def generate(self, ids: list[int], max_new_tokens: int, assisted: bool) -> HFRun:
        """Greedy generation of exactly max_new_tokens tokens; timed from the call to the return."""
        torch.set_num_threads(self.threads)
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        config = copy.deepcopy(self.gen_config)
        config.max_new_tokens = max_new_tokens
        config.min_new_tokens = 0
        kwargs: dict[str, Any] = {}
        if assisted:
            for name, value in self.settings.generate_kwargs().items():
                setattr(config, name, value)
            if self.assistant is not None:
                kwargs["assistant_model"] = self.assistant
        streamer = TimingStreamer()
        start = time.perf_counter()
        out = self.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, streamer=streamer, **kwargs
        )
        wall = time.perf_counter() - start
        tokens = out[0, len(ids) :].tolist()
        arrivals = [(t - start, n) for t, n in zip(streamer.times, streamer.counts)]
        return HFRun(tokens, wall, arrivals)

    @torch.inference_mode()
    def verify_costs(self, n_max: int, context_tokens: int = 300, reps: int = 5) -> dict[str, Any]:
        """v(n) for n = 1..n_max: one forward of n new tokens after a warm cache of context_tokens.

        The cache is cropped back to context_tokens after each forward (what a rejected draft
        costs), so every measurement sees the same cache length. Median of ``reps`` runs,
        measured in interleaved passes over n so that drift affects all n alike.
        """
        return measure_verify_costs(
            self.model, self.threads, n_max, context_tokens, reps, vocab=self.model.config.vocab_size
        )

    def draft_step_cost(self, context_tokens: int = 300, reps: int = 5) -> float | None:
        """c: one draft step (1 token, warm cache) relative to one target step; None without a model draft."""
        if self.assistant is None:
            return None
        vd = measure_verify_costs(
            self.assistant, self.threads, 1, context_tokens, reps, vocab=self.model.config.vocab_size
        )
        vt = measure_verify_costs(self.model, self.threads, 1, context_tokens, reps, vocab=self.model.config.vocab_size)
        return vd["ms"]["1"] / vt["ms"]["1"]
