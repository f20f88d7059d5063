"""llama.cpp's own target-alone decoding of a GGUF as the reference of identity tests on the default engine.

`LlamaCppReference.greedy` is llama-cpp-python's `Llama.generate` (llama.cpp's decoding loop and its greedy
sampler), not our runner; the top-2 gap where two decodings part is read from a 1-row pass of our runner, as
llama.cpp's own decoding computes that position. A difference counts as a near-tie below LLAMACPP_TIE_LOGITS:
a (k+1)-row verify and a 1-row step round one position's logits up to ~1.1 apart (tests/unit/test_llamacpp_runner.py).
"""

from __future__ import annotations

from typing import Sequence

from specdec.bench.llamacpp import LLAMACPP_TIE_LOGITS, target_gguf

N_CTX = 4096


class LlamaCppReference:
    """The GGUF of `spec` on llama.cpp, one thread (the services under test need the other core)."""

    tie_logits = LLAMACPP_TIE_LOGITS

    def __init__(self, spec: str = "embedded", threads: int = 1) -> None:
        import llama_cpp

        from specdec.engine.llamacpp_runner import LlamaCppRunner, LlamaCppSettings

        path = str(target_gguf(spec))
        self.runner = LlamaCppRunner(path, LlamaCppSettings(threads=threads, kv_tokens=N_CTX, sessions=2))
        self.llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=N_CTX,
                                   verbose=False)

    def greedy(self, ids: Sequence[int], max_new: int, eos: Sequence[int]) -> list[int]:
        """llama.cpp's greedy continuation of `ids`: at most max_new tokens, through the first EOS."""
        out: list[int] = []
        self.llm.reset()
        for token in self.llm.generate(list(ids), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if token in eos or len(out) >= max_new:
                break
        return out

    def top2_gap(self, ids: Sequence[int]) -> float:
        import torch

        logits = self.runner.extend("gap", list(ids), len(ids) - 1).logits[0]
        self.runner.pool.release("gap")
        top = torch.topk(logits, 2).values
        return float(top[0] - top[1])

    def divergence(self, prompt_ids: list[int], got: list[int], want: list[int]) -> str:
        """"" when equal, "tie" when they first part at a near-tie (reported with its gap), else a message."""
        j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is None:
            return "" if len(got) == len(want) else f"lengths differ: {len(got)} vs {len(want)}"
        gap = self.top2_gap(prompt_ids + want[:j])
        if gap < self.tie_logits:
            return "tie"
        return f"diverged at {j} (top-2 gap {gap:.3f}): got {got[j:j + 5]} want {want[j:j + 5]}"

    def close(self) -> None:
        self.runner.close()
        self.llm.close()
