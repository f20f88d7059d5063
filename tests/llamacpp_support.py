"""llama.cpp's own target-alone decoding of a GGUF as the reference of identity tests on the default engine.

`LlamaCppReference.greedy` is llama-cpp-python's `Llama.generate` (llama.cpp's decoding loop and its greedy
sampler), not our runner; the top-2 gap where two decodings part is read from a 1-row pass of our runner, as
llama.cpp's own decoding computes that position. A difference counts as a near-tie below the probe's threshold (LLAMACPP_TIE_LOGITS):
a (k+1)-row verify and a 1-row step round one position's logits up to ~1.1 apart (tests/unit/test_llamacpp_runner.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.bench.llamacpp import LLAMACPP_N_CTX, LlamaCppProbe, target_gguf


class LlamaCppReference:
    """The GGUF of `spec` on llama.cpp, one thread (the services under test need the other core)."""

    def __init__(self, spec: str = "embedded", threads: int = 1) -> None:
        import llama_cpp

        path = str(target_gguf(spec))
        self.probe = LlamaCppProbe(path, threads)  # the bench's: 1-row passes of our runner
        self.llm = llama_cpp.Llama(
            model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=LLAMACPP_N_CTX, verbose=False
        )

    def greedy(self, ids: Sequence[int], max_new: int, eos: Sequence[int]) -> list[int]:
        """llama.cpp's greedy continuation of `ids`: at most max_new tokens, through the first EOS."""
        out: list[int] = []
        self.llm.reset()
        for token in self.llm.generate(list(ids), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if token in eos or len(out) >= max_new:
                break
        return out

    def divergence(self, prompt_ids: list[int], got: list[int], want: list[int]) -> str:
        """ "" when equal, "tie" when they first part at a near-tie (reported with its gap), else a message."""
        j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is None:
            return "" if len(got) == len(want) else f"lengths differ: {len(got)} vs {len(want)}"
        gap, tie = self.probe.top2_gap(prompt_ids, want[:j])
        if gap < tie:
            return "tie"
        return f"diverged at {j} (top-2 gap {gap:.3f}): got {got[j : j + 5]} want {want[j : j + 5]}"

    def close(self) -> None:
        self.probe.close()
        self.llm.close()
