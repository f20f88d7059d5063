"""The CPU user's alternative as an anchor column: llama.cpp (llama-cpp-python) serving the target's
own GGUF file, target alone, greedy, the same chat prompt ids and token count as our stack.

llama-cpp-python is an optional extra (`pip install llama-cpp-python`, a C++ build from its sdist;
not in requirements.txt or constraints.txt): without it the bench records why the column is missing
and goes on. It runs after the stack stopped, with the bench's thread count, in a child process of
its own: a crash of the native library (seen: SIGSEGV in llama.cpp's AMX matmul on an Intel Xeon VM,
when built with its default GGML_NATIVE) then costs the column, not the run.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Sequence

INSTALL_HINT = "pip install llama-cpp-python (optional extra; builds llama.cpp from source)"
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


def anchor_lines(result: dict[str, Any]) -> list[str]:
    """The table's llama.cpp lines: its tok/s per set beside our k = 0 and our fastest configuration."""
    anchor = result.get("llamacpp")
    if not anchor:
        return []
    if "skipped" in anchor:
        return ["", f"llama.cpp anchor: skipped ({anchor['skipped']})"]
    lines = ["", f"llama.cpp anchor (llama-cpp-python {anchor['version']}, {anchor['gguf']}, target alone, "
                 f"{anchor['threads']} threads, greedy):"]
    for s, tok_s in anchor["tok_s"].items():
        ours = result.get(s, {}).get("tokens_per_s", {})
        medians = {n: v["median"] if isinstance(v, dict) else v for n, v in ours.items() if v and not n.startswith("hf")}
        best = max(medians, key=medians.get, default=None)
        k0 = medians.get("k0")
        tail = (f"; ours k = 0 {k0:.1f} ({k0 / tok_s:.2f}x), best {best} {medians[best]:.1f} "
                f"({medians[best] / tok_s:.2f}x)") if best and k0 else ""
        lines.append(f"  {s}: {tok_s:.1f} tok/s{tail}")
    return lines


def llamacpp_anchor(target_model: str, prompts: Sequence[Any], max_new: int, repeats: int,
                    threads: int) -> dict[str, Any]:
    """tok/s of llama.cpp on each prompt set (median over prompts x repeats), or why it was skipped;
    measured in a spawned child process (`_measure`)."""
    try:
        import llama_cpp  # noqa: F401 - only whether it is there; the child imports it again
    except ImportError:
        return {"skipped": f"llama-cpp-python is not installed: {INSTALL_HINT}"}
    gguf = target_gguf(target_model)
    if gguf is None:
        return {"skipped": f"the target {target_model!r} is not a GGUF file: llama.cpp needs one"}
    jobs = [(p.set, list(p.ids)) for p in prompts]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(_measure, str(gguf), jobs, max_new, repeats, threads).result()
        except BrokenProcessPool as exc:
            return {"skipped": f"llama.cpp crashed in its child process ({exc}); build llama-cpp-python "
                               "with other CMAKE_ARGS (docs/performance.md, 'llama.cpp anchor')"}


def _measure(gguf: str, jobs: list[tuple[str, list[int]]], max_new: int, repeats: int,
             threads: int) -> dict[str, Any]:
    """The child process of llamacpp_anchor: load the GGUF, warm up, time every (set, ids) job."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads,
                          n_ctx=LLAMACPP_N_CTX, verbose=False)
    _generate(llm, jobs[0][1], min(8, max_new))                            # warm-up
    per_set: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, ids in jobs:
            n, wall = _generate(llm, ids, max_new)
            per_set.setdefault(name, []).append(n / wall)
    system_info = llama_cpp.llama_print_system_info() if hasattr(llama_cpp, "llama_print_system_info") else b""
    return {"version": llama_cpp.__version__, "gguf": Path(gguf).name, "threads": threads, "max_new_tokens": max_new,
            "system_info": system_info.decode(errors="replace").strip(),    # the CPU features it was built with
            "tok_s": {s: statistics.median(v) for s, v in per_set.items()}, "runs": per_set}
