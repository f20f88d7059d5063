"""The CPU user's alternative as an anchor column: llama.cpp (llama-cpp-python) serving the target's
own GGUF file, target alone, greedy, the same chat prompt ids and token count as our stack.

llama-cpp-python is the llama.cpp engine's library (`make install` builds it): without it the bench records why
the column is missing and goes on. It runs with the bench's thread count in a child process of its own, each prompt
right after our configurations ran it (LibraryAnchor): a crash of the native library then costs the column, not the
run.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from specdec.bench.plan import WARMUP_TOKENS

INSTALL_HINT = "make install (builds llama-cpp-python portable: scripts/build_llamacpp.sh)"
# Context window llama.cpp allocates: the longest bench prompt plus the generated tokens fit.
LLAMACPP_N_CTX = 4096


def target_gguf(target_model: str) -> Path | None:
    """The GGUF file the target spec names (embedded or a local/hub ::file.gguf), or None."""
    from specdec.models.resolve import resolve_gguf_file
    from specdec.models.spec import parse_model_spec

    spec = parse_model_spec(target_model)
    if not spec.is_gguf:
        return None
    path, _ = resolve_gguf_file(spec)
    return path


def _generate(llm: Any, ids: Sequence[int], max_new: int) -> tuple[int, float]:
    """Greedy, EOS ignored (as the stack's ignore_eos): (tokens, wall seconds incl. prefill)."""
    llm.reset()
    start, n = time.perf_counter(), 0
    for _ in llm.generate(list(ids), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        n += 1
        if n >= max_new:
            break
    return n, time.perf_counter() - start


def our_medians(result: dict[str, Any], set_name: str) -> dict[str, float]:
    """Our configurations' median tok/s on one prompt set (the HF anchors left out), for the anchors' lines."""
    ours = result.get(set_name, {}).get("tokens_per_s", {})
    return {n: v["median"] if isinstance(v, dict) else v for n, v in ours.items() if v and not n.startswith("hf")}


def anchor_lines(result: dict[str, Any]) -> list[str]:
    """The table's llama.cpp lines: its tok/s per set beside our k = 0 and our fastest configuration."""
    anchor = result.get("llamacpp")
    if not anchor:
        return []
    if "skipped" in anchor:
        return ["", f"llama.cpp anchor: skipped ({anchor['skipped']})"]
    lines = [
        "",
        f"llama.cpp anchor (llama-cpp-python {anchor['version']}, {anchor['gguf']}, target alone, "
        f"{anchor['threads']} threads, greedy):",
    ]
    for s, tok_s in anchor["tok_s"].items():
        medians = our_medians(result, s)
        best = max(medians, key=lambda name: medians[name], default=None)
        k0 = medians.get("k0")
        tail = (
            (
                f"; ours k = 0 {k0:.1f} ({k0 / tok_s:.2f}x), best {best} {medians[best]:.1f} "
                f"({medians[best] / tok_s:.2f}x)"
            )
            if best and k0
            else ""
        )
        lines.append(f"  {s}: {tok_s:.1f} tok/s{tail}")
    return lines


class LibraryAnchor:
    """llama.cpp through llama-cpp-python, target alone, in a spawned child process that loads the GGUF once and
    stays through the bench's loop: `measure(p)` times prompt `p` right after our configurations ran it, so a drift
    of the machine falls on both alike. A crash of the native library (seen: SIGSEGV in llama.cpp's AMX matmul on
    an Intel Xeon VM, when built with its default GGML_NATIVE) costs the column, with its reason, not the run."""

    def __init__(self, target_model: str, threads: int, max_new: int) -> None:
        self.target_model, self.threads, self.max_new = target_model, threads, max_new
        self.skipped = ""
        self.info: dict[str, Any] = {}
        self.runs: dict[str, list[float]] = {}
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LibraryAnchor:
        try:
            import llama_cpp  # noqa: F401 - only whether it is there; the child imports it again
        except ImportError:
            self.skipped = f"llama-cpp-python is not installed: {INSTALL_HINT}"
            return self
        gguf = target_gguf(self.target_model)
        if gguf is None:
            self.skipped = f"the target {self.target_model!r} is not a GGUF file: llama.cpp needs one"
            return self
        self.pool = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_load, initargs=(str(gguf), self.threads)
        )
        self.info = self._call(_describe) or {}
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def warm_up(self, ids: Sequence[int]) -> None:
        self._call(_generate_job, list(ids), min(WARMUP_TOKENS, self.max_new))

    def measure(self, p: Any) -> None:
        got = self._call(_generate_job, list(p.ids), self.max_new)
        if got is not None:
            n, wall = got
            self.runs.setdefault(p.set, []).append(n / wall)

    def _call(self, fn: Any, *args: Any) -> Any:
        if self.pool is None:
            return None
        try:
            return self.pool.submit(fn, *args).result()
        except BrokenProcessPool as exc:
            self.skipped = (
                f"llama.cpp crashed in its child process ({exc}); build llama-cpp-python "
                "with other CMAKE_ARGS (docs/engines.md, 'Installing llama.cpp')"
            )
            self.__exit__()
            return None

    def result(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            **self.info,
            "threads": self.threads,
            "max_new_tokens": self.max_new,
            "tok_s": {s: statistics.median(v) for s, v in self.runs.items()},
            "runs": self.runs,
        }


_CHILD: dict[str, Any] = {}  # the child process's model and its file's name (LibraryAnchor's pool initializer)


def _load(gguf: str, threads: int) -> None:
    import llama_cpp

    from specdec.engine.llamacpp_lib import load_backends

    load_backends(llama_cpp)  # ggml's CPU variants from the package folder (llama.cpp looks beside the executable only)
    _CHILD["llm"] = llama_cpp.Llama(
        model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=LLAMACPP_N_CTX, verbose=False
    )
    _CHILD["gguf"] = Path(gguf).name


def _describe() -> dict[str, Any]:
    import llama_cpp

    system_info = llama_cpp.llama_print_system_info() if hasattr(llama_cpp, "llama_print_system_info") else b""
    return {
        "version": llama_cpp.__version__,
        "gguf": _CHILD["gguf"],
        "system_info": system_info.decode(errors="replace").strip(),  # the CPU features it was built with
    }


def _generate_job(ids: list[int], max_new: int) -> tuple[int, float]:
    return _generate(_CHILD["llm"], ids, max_new)


# A token where our llama.cpp stack and its k = 0 part ways is a near-tie when the target's top-2 logit gap there
# is below this: one position's logits differ by up to ~1.1 between passes of different row counts (SmolLM2 Q4_1,
# measured in tests/unit/test_llamacpp_runner.py), so a (k+1)-row verify may pick the other of two tokens that close.
LLAMACPP_TIE_LOGITS = 1.2


class LlamaCppProbe:
    """The target's GGUF on an in-process llama.cpp runner (the same engine and threads as the target service), for
    what the bench measures in process after the stack stopped: v(n) and the top-2 gap where tokens differ."""

    def __init__(self, gguf: str, threads: int) -> None:
        from specdec.engine.llamacpp_runner import LlamaCppRunner, LlamaCppSettings

        self.runner = LlamaCppRunner(gguf, LlamaCppSettings(threads=threads, kv_tokens=LLAMACPP_N_CTX, sessions=2))
        self.threads = threads

    def describe(self) -> str:
        return f"llama.cpp {self.runner.file_type} ({self.runner.lib.cpu_variant or 'built-in'} kernels)"

    def verify_costs(self, n_max: int, context_tokens: int = 300, reps: int = 5) -> dict[str, Any]:
        """v(n) as measure_verify_costs defines it: n new tokens after a warm cache of context_tokens, rolled back
        after each pass, n interleaved within each repeat, the first repeat dropped; logits on all n rows."""
        context = [100 + (i * 7919) % 30000 for i in range(context_tokens)]
        self.runner.extend("v", context, context_tokens - 1)
        samples: dict[int, list[float]] = {n: [] for n in range(1, n_max + 1)}
        for rep in range(reps + 1):
            for n in range(1, n_max + 1):
                new = [100 + (rep * 31 + n * 17 + j) % 30000 for j in range(n)]
                fwd = self.runner.extend("v", context + new, context_tokens)  # rolls the last pass back first
                if rep:
                    samples[n].append(fwd.forward_ms)
        self.runner.pool.release("v")
        ms = {str(n): statistics.median(v) for n, v in samples.items()}
        return {
            "context_tokens": context_tokens,
            "reps": reps,
            "threads": self.threads,
            "ms": ms,
            "ratio": {n: v / ms["1"] for n, v in ms.items()},
            "spread_ms": {str(n): [min(v), max(v)] for n, v in samples.items()},
            "kv_bytes_per_token_measured": self.runner.bytes_per_token,
        }

    def top2_gap(self, prompt_ids: list[int], prefix: list[int]) -> tuple[float, float]:
        """The target's top-2 logit gap after prompt + prefix (a 1-row step, as k = 0 ran it) and the tie threshold."""
        import torch

        ids = list(prompt_ids) + list(prefix)
        logits = self.runner.extend("gap", ids, len(ids) - 1).logits[0]
        self.runner.pool.release("gap")
        top = torch.topk(logits, 2).values
        return float(top[0] - top[1]), LLAMACPP_TIE_LOGITS

    def is_eog(self, token: int) -> bool:
        """Whether llama.cpp treats `token` as an end of generation (what llama-server's ignore_eos masks)."""
        return self.runner.lib.is_eog(self.runner.model, token)

    def close(self) -> None:
        self.runner.close()
