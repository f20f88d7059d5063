"""llama.cpp's own server as the bench's anchor: the target alone and with its draftless speculation, on the
same GGUF file, threads and prompt ids as our stack, greedy, EOS ignored, timed at the client with prefill.

The binary is optional (`make llama-server` builds it from the sources in llama-cpp-python's sdist,
scripts/build_llamacpp.sh; or --llama-server PATH): without it the bench records why the columns are missing.
Each configuration is a fresh server process on a free loopback port; a request sends the prompt as token ids
to /completion with `cache_prompt: false`, so every run prefills its prompt as ours does.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec import children
from specdec.bench.llamacpp import our_medians
from specdec.bench.plan import WARMUP_TOKENS
from specdec.launcher import free_port

BUILD_HINT = "make llama-server (builds llama.cpp's server from llama-cpp-python's sdist, a few minutes)"
N_CTX = 4096  # the longest bench prompt plus its tokens fit
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0
# Its speculation without a draft model: the types this llama.cpp offers, each with the settings we found best
# for short chat answers on 2 cores (a draft of up to 4 tokens behind a 2-3 token match); the best one is kept.
SPEC_CONFIGS: dict[str, list[str]] = {
    "server": [],
    "server_ngram_simple": [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "2",
        "--spec-ngram-simple-size-m",
        "4",
    ],
    "server_ngram_mod": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-max", "4"],
}


def find_binary(explicit: str = "") -> Path | None:
    """--llama-server PATH, $LLAMA_SERVER, the one `make llama-server` built, or llama-server on PATH."""
    candidates = [explicit, os.environ.get("LLAMA_SERVER", "")]
    cache = Path(os.environ.get("SPECDEC_WHEEL_CACHE", Path.home() / ".cache" / "specdec" / "wheels"))
    candidates += sorted((str(p) for p in cache.glob("llama-server-*/bin/llama-server")), reverse=True)
    candidates.append(shutil.which("llama-server") or "")
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    return None


class LlamaServer:
    """One llama-server process serving `gguf` with `threads` threads and `extra` arguments."""

    def __init__(self, binary: Path, gguf: str, threads: int, extra: Sequence[str], slots: int = 1) -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115 - lives with the server
        cmd = [
            str(binary),
            "-m",
            gguf,
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(N_CTX * slots),
            "-np",
            str(slots),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-webui",
            *extra,
        ]
        libs = os.pathsep.join(filter(None, (str(binary.parent), os.environ.get("LD_LIBRARY_PATH", ""))))
        self.proc = children.popen(  # ends with the bench however the bench ends
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "LD_LIBRARY_PATH": libs},
        )  # its libraries lie beside it

    def __enter__(self) -> LlamaServer:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); log: {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.__exit__()
        raise TimeoutError(f"llama-server did not become healthy in {START_TIMEOUT_S:.0f} s; log: {self.log.name}")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)

    def complete(self, ids: Sequence[int], max_new: int) -> tuple[list[int], float]:
        """Greedy completion of the prompt ids, EOS ignored: (token ids, wall seconds at the client)."""
        body = json.dumps(
            {
                "prompt": list(ids),
                "n_predict": max_new,
                "ignore_eos": True,
                "temperature": 0.0,
                "top_k": 1,
                "cache_prompt": False,
                "return_tokens": True,
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion", body, {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
            out = json.loads(r.read())
        return list(out.get("tokens", [])), time.perf_counter() - start


def locate(gguf: Path | None, binary: str = "") -> tuple[Path | None, str]:
    """The llama-server binary to run on `gguf` (find_binary), or None and why it cannot run here."""
    if gguf is None:
        return None, "the target is not a GGUF file: llama-server needs one"
    path = find_binary(binary)
    return (path, "") if path is not None else (None, f"no llama-server binary: {BUILD_HINT}")


class ServerAnchors:
    """llama-server target alone and with each SPEC_CONFIGS speculation (or only those named in `configs`, in
    SPEC_CONFIGS' order), each its own process kept running through the bench's loop: `measure(p)` runs a prompt on
    every one right after our configurations ran it, so a drift of the machine falls on both sides alike (the
    idle servers wait on a socket). A configuration that fails to start is recorded with its reason."""

    def __init__(
        self,
        gguf: Path | None,
        threads: int,
        max_new: int,
        configs: Sequence[str] | None = None,
        binary: str = "",
    ) -> None:
        self.gguf, self.threads, self.max_new = gguf, threads, max_new
        self.path, self.unavailable = locate(gguf, binary)
        self.names = [n for n in SPEC_CONFIGS if configs is None or n in configs]
        self.servers: dict[str, LlamaServer] = {}
        self.skipped: dict[str, str] = {}
        self.runs: dict[str, dict[str, list[float]]] = {}
        self.tokens: dict[str, dict[str, list[int]]] = {}

    def __enter__(self) -> ServerAnchors:
        if self.path is None or self.gguf is None:
            return self
        for name in self.names:
            try:
                server = LlamaServer(self.path, str(self.gguf), self.threads, SPEC_CONFIGS[name]).__enter__()
            except (RuntimeError, TimeoutError, OSError) as exc:
                self.skipped[name] = str(exc)
                continue
            self.servers[name] = server
            self.runs[name], self.tokens[name] = {}, {}
        return self

    def __exit__(self, *exc: Any) -> None:
        for server in self.servers.values():
            server.__exit__()
        self.servers = {}

    def warm_up(self, ids: Sequence[int]) -> None:
        for name in list(self.servers):
            self._complete(name, ids, min(WARMUP_TOKENS, self.max_new))

    def measure(self, p: Any) -> None:
        """One greedy generation of prompt `p` on every running configuration: its tok/s and (first time) tokens."""
        for name in list(self.servers):
            got = self._complete(name, p.ids, self.max_new)
            if got is not None:
                tokens, wall = got
                self.runs[name].setdefault(p.set, []).append(len(tokens) / wall)
                self.tokens[name].setdefault(f"{p.set}/{p.id}", tokens)

    def _complete(self, name: str, ids: Sequence[int], max_new: int) -> tuple[list[int], float] | None:
        try:
            return self.servers[name].complete(ids, max_new)
        except (OSError, ValueError) as exc:  # a dead or failing server costs its column, not the run
            self.skipped[name] = f"request failed: {exc}"
            self.servers.pop(name).__exit__()
            return None

    def result(self) -> dict[str, Any]:
        """What the bench records: per configuration its args, tok/s per prompt set (median over prompts x
        repeats), the runs and its greedy tokens per prompt (identity against ours), or why it was skipped."""
        if self.unavailable:
            return {"skipped": self.unavailable}
        configs: dict[str, Any] = {}
        for name in self.names:
            if name in self.skipped:
                configs[name] = {"skipped": self.skipped[name]}
            elif name in self.runs:
                configs[name] = {
                    "args": SPEC_CONFIGS[name],
                    "tok_s": {s: statistics.median(v) for s, v in self.runs[name].items()},
                    "runs": self.runs[name],
                    "tokens": self.tokens[name],
                }
        return {
            "binary": str(self.path),
            "gguf": self.gguf.name if self.gguf is not None else "",
            "threads": self.threads,
            "max_new_tokens": self.max_new,
            "order": "interleaved with our configurations: each prompt on every server right after ours",
            "configs": configs,
        }


def server_lines(result: dict[str, Any]) -> list[str]:
    """The table's llama-server lines: each configuration's tok/s per set, and ours against the best of them."""
    anchor = result.get("llama_server")
    if not anchor:
        return []
    if "skipped" in anchor:
        return ["", f"llama-server anchor: skipped ({anchor['skipped']})"]
    lines = ["", f"llama-server ({anchor['gguf']}, {anchor['threads']} threads, greedy, prefill included):"]
    best: dict[str, float] = {}
    for name, cfg in anchor["configs"].items():
        if "skipped" in cfg:
            lines.append(f"  {name}: skipped ({cfg['skipped']})")
            continue
        lines.append(f"  {name}: " + ", ".join(f"{s} {v:.1f} tok/s" for s, v in cfg["tok_s"].items()))
        for s, v in cfg["tok_s"].items():
            best[s] = max(best.get(s, 0.0), v)
    for s, v in best.items():
        ours = our_medians(result, s)
        alone = anchor["configs"].get("server", {}).get("tok_s", {}).get(s)
        if ours and alone:
            top = max(ours, key=lambda name: ours[name])
            lines.append(
                f"  {s}: ours k = 0 {ours.get('k0', 0):.1f} ({ours.get('k0', 0) / alone:.2f}x server alone); "
                f"ours best {top} {ours[top]:.1f} ({ours[top] / v:.2f}x the best server {v:.1f})"
            )
    same = result.get("identity_vs_llama_server", {}).get("k0")
    if same:
        lines.append(
            f"  greedy tokens, ours k = 0 vs server alone: identical on {same['identical']} of {same['prompts']}"
        )
        lines += [f"    {difference_line(d)}" for d in same["differences"]]
    return lines


def difference_line(d: dict[str, Any]) -> str:
    """One difference of server_identity in words."""
    where = f"{d['prompt']} at position {d['position']}"
    if d.get("ends_generation"):
        return f"{where}: ours ends a generation there (llama-server's ignore_eos masks it, ours emits it and goes on)"
    if d.get("top2_logit_gap") is None:
        return where
    tie = f"near-tie (<= {d['tie_threshold']:.3g})" if d["near_tie"] else "not a near-tie"
    return f"{where}: top-2 logit gap {d['top2_logit_gap']:.3f}, {tie}"


def server_identity(
    records: Sequence[Any], prompts: Sequence[Any], anchor: dict[str, Any], gap: Any = None, is_eog: Any = None
) -> dict[str, Any]:
    """Our k = 0 (and every configuration) against llama-server's target alone, prompt by prompt (repeat 0):
    identical, or the first differing position with the target's top-2 logit gap there (`gap(prompt_ids, prefix)`).
    `ends_generation` marks a difference where our token ends a generation (`is_eog(token)`): llama-server's
    ignore_eos masks such tokens, so it takes the runner-up where we emit the token and go on, as vLLM's ignore_eos
    does; the greedy decodings agree up to there."""
    from specdec.bench.identity import first_divergence

    alone = anchor.get("configs", {}).get("server", {}).get("tokens")
    if not alone:
        return {}
    ids = {(p.set, p.id): list(p.ids) for p in prompts}
    out: dict[str, Any] = {}
    for r in (r for r in records if r.repeat == 0):
        theirs = alone.get(f"{r.set}/{r.prompt}")
        if theirs is None:
            continue
        per = out.setdefault(r.config, {"identical": 0, "prompts": 0, "differences": []})
        per["prompts"] += 1
        pos = first_divergence(theirs, list(r.tokens))
        if pos is None:
            per["identical"] += 1
            continue
        logit_gap, eps = gap(ids[(r.set, r.prompt)], theirs[:pos]) if gap is not None else (None, 0.0)
        per["differences"].append(
            {
                "prompt": f"{r.set}/{r.prompt}",
                "position": pos,
                "top2_logit_gap": logit_gap,
                "tie_threshold": eps,
                "near_tie": logit_gap is not None and logit_gap <= eps,
                "ends_generation": is_eog is not None and pos < len(r.tokens) and is_eog(r.tokens[pos]),
            }
        )
    return out


class ServerWaves:
    """llama-server with `slots` slots (continuous batching, `-np`) on bench-concurrency's prompts, kept running through
    its loop: `wave(c)` runs the prompts in waves of c requests at once right after our stacks ran that c, so a drift
    of the machine falls on both alike. `result()`: aggregate tok/s per c (median over repeats), or why it was
    skipped."""

    def __init__(
        self,
        gguf: Path | None,
        prompt_ids: Sequence[Sequence[int]],
        slots: int,
        max_new: int,
        threads: int,
        binary: str = "",
    ) -> None:
        self.gguf, self.prompt_ids, self.slots, self.max_new, self.threads = gguf, prompt_ids, slots, max_new, threads
        self.path, self.skipped = locate(gguf, binary)
        self.server: LlamaServer | None = None
        self.per_c: dict[str, list[float]] = {}

    def __enter__(self) -> ServerWaves:
        from concurrent.futures import ThreadPoolExecutor

        if self.path is None or self.gguf is None:
            return self
        try:
            self.server = LlamaServer(self.path, str(self.gguf), self.threads, [], slots=self.slots).__enter__()
            self.pool = ThreadPoolExecutor(self.slots)
            self.server.complete(self.prompt_ids[0], WARMUP_TOKENS)
        except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
            self.skipped = str(exc)
            self.__exit__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.server is not None:
            self.server.__exit__()
            self.pool.shutdown()
            self.server = None

    def wave(self, c: int) -> None:
        """Every prompt, in waves of c at once: one sample of aggregate tok/s for c."""
        server = self.server
        if server is None:
            return
        tokens, wall = 0, 0.0
        try:
            for first in range(0, len(self.prompt_ids), c):
                start = time.perf_counter()
                batch = self.prompt_ids[first : first + c]
                done = list(self.pool.map(lambda ids: server.complete(ids, self.max_new), batch))
                wall += time.perf_counter() - start
                tokens += sum(len(t) for t, _ in done)
        except (OSError, ValueError) as exc:  # a dead or failing server costs its column, not the run
            self.skipped = f"request failed: {exc}"
            self.__exit__()
            return
        self.per_c.setdefault(str(c), []).append(tokens / wall)

    def result(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            "binary": str(self.path),
            "gguf": self.gguf.name if self.gguf is not None else "",
            "threads": self.threads,
            "slots": self.slots,
            "order": "interleaved: each repeat's c right after our stacks ran it",
            "tokens_per_s": {c: statistics.median(v) for c, v in self.per_c.items()},
            "runs": self.per_c,
        }
