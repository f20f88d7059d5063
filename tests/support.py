"""Shared test helpers: the SmolLM2 tokenizer, tiny model pairs, and an in-process stack.

The in-process stack runs the real draft, target and orchestrator servicers as
three grpc.aio servers on loopback ports inside one background event loop,
with a real Redis server. It exercises everything but process boundaries
(tests/integration/test_processes.py covers those) and is fast enough for the
hundreds of generations the greedy-identity test runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch

from draft_service import servicer as draft_servicer
from orchestrator.deps import Deps
from orchestrator.pair import PairMonitor
from orchestrator.prompting import Prompter
from orchestrator.replicas import ReplicaPool
from orchestrator.rounds import RoundRunner
from orchestrator.servicer import SERVICE_NAME as ORCH_NAME
from orchestrator.servicer import Admission, OrchestratorServicer
from orchestrator.session_store import SessionStore, open_redis
from specdec.config import ModelServiceConfig, OrchestratorConfig, ServerConfig
from specdec.engine.loading import ModelBundle, load_draft, load_target
from specdec.models.loader import load_tokenizer
from specdec.models.tiny import build_tiny_causal_lm, save_tiny_pair
from specdec.models.tokenizer_info import describe_tokenizer
from specdec.server.app import GrpcApp
from specdec.v1 import orchestrator_pb2_grpc
from target_service import servicer as target_servicer
from tests.worker_pool import per_process

TINY_NOISE = 0.03
TINY_INIT_RANGE = 0.5
EOS_PROBE_TOKENS = 24
START_TIMEOUT_S = 60.0

_tokenizer_cache: dict[str, Any] = {}
_eos_cache: dict[tuple[tuple[str, ...], int], int] = {}


def smollm2_tokenizer() -> Any:
    """The real SmolLM2 tokenizer (from the embedded GGUF, cached by the loader)."""
    if "smollm2" not in _tokenizer_cache:
        _tokenizer_cache["smollm2"] = load_tokenizer("embedded")
    return _tokenizer_cache["smollm2"]


def pick_emitted_eos(model: Any, tokenizer: Any, prompts: list[str]) -> int:
    """A token the tiny target actually emits on about half of the prompts (so EOS paths run)."""
    seen: dict[int, int] = {}
    for text in prompts:
        ids = torch.tensor([tokenizer.encode(text)])
        out = model.generate(ids, max_new_tokens=EOS_PROBE_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, ids.shape[1] :
        ].tolist()
        for t in set(out):
            seen[t] = seen.get(t, 0) + 1
    target = len(prompts) / 2
    return min(seen, key=lambda t: (abs(seen[t] - target), t))


def make_tiny_pair(directory: Path, prompts: list[str], noise: float = TINY_NOISE, seed: int = 0) -> tuple[Path, Path]:
    """Save a tiny Llama target (with an EOS it emits) and a perturbed draft; return their dirs."""
    tok = smollm2_tokenizer()
    key = (tuple(prompts), seed)
    if key not in _eos_cache:  # the probe is deterministic: once per test session, not once per module
        _eos_cache[key] = pick_emitted_eos(
            build_tiny_causal_lm(tok, seed=seed, init_range=TINY_INIT_RANGE), tok, prompts
        )
    eos = _eos_cache[key]
    pair = save_tiny_pair(directory, tok, noise=noise, seed=seed, init_range=TINY_INIT_RANGE, eos_token_id=eos)
    return pair.target_dir, pair.draft_dir


@dataclass
class InProcessStack:
    """Draft, target and orchestrator servers in one background event loop."""

    target_model: str
    draft_model: str = ""
    draft_kind: str = "model"
    redis_url: str = ""
    threads: int = 1
    target_dtype: str = ""  # e.g. "int8": the target's --dtype ("": SPECDEC_DTYPE or auto)

    def start(self) -> InProcessStack:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())
        return self

    def call(self, coro: Any, timeout: float = START_TIMEOUT_S) -> Any:
        """Run a coroutine on the stack's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _serve_model(self, role: str, bundle: ModelBundle) -> tuple[GrpcApp, Any, int]:
        mod = draft_servicer if role == "draft" else target_servicer
        servicer = mod.DraftServicer() if role == "draft" else mod.TargetServicer()
        servicer.bundle = bundle
        app = GrpcApp(mod.SERVICE_NAME, ServerConfig(host="127.0.0.1", port=0, drain_seconds=1.0))
        port = await app.start(lambda server: mod.add_to_server(servicer, server))
        await app.set_serving(True)
        return app, servicer, port

    async def _start(self) -> None:
        torch.set_num_threads(self.threads)
        tcfg = ModelServiceConfig(
            role="target",
            model=self.target_model,
            cache_budget_bytes=1 << 30,
            **({"dtype": self.target_dtype} if self.target_dtype else {}),
        )
        dcfg = ModelServiceConfig(
            role="draft", model=self.draft_model, draft_kind=self.draft_kind, cache_budget_bytes=1 << 30
        )
        self.target_bundle = await asyncio.to_thread(load_target, tcfg)
        self.draft_bundle = await asyncio.to_thread(load_draft, dcfg)
        self.target_app, self.target_servicer, tport = await self._serve_model("target", self.target_bundle)
        self.draft_app, self.draft_servicer, dport = await self._serve_model("draft", self.draft_bundle)
        await self._start_orchestrator(f"127.0.0.1:{tport}", f"127.0.0.1:{dport}")

    async def _start_orchestrator(self, target_address: str, draft_address: str) -> None:
        cfg = OrchestratorConfig(
            tokenizer=self.target_model,
            draft_addresses=draft_address,
            target_addresses=target_address,
            redis_url=self.redis_url,
            server=ServerConfig(host="127.0.0.1", port=0, drain_seconds=1.0),
        )
        tokenizer = await asyncio.to_thread(load_tokenizer, self.target_model)
        target = ReplicaPool("target", cfg.target_addresses, cfg.server, cfg.retry)
        draft = ReplicaPool("draft", cfg.draft_addresses, cfg.server, cfg.retry)
        self.pair = PairMonitor(target, draft, describe_tokenizer(tokenizer), cfg.tokenizer, refresh_s=1.0)
        await self.pair.refresh()
        info = self.pair.target_info()
        store = SessionStore(open_redis(self.redis_url), prefix=f"test-{uuid.uuid4().hex[:8]}:")
        self.deps = Deps(
            cfg=cfg,
            store=store,
            runner=RoundRunner(draft, target, cfg.retry),
            prompter=Prompter(tokenizer),
            eos_ids=frozenset(info.eos_token_ids),
            max_context=info.max_context,
            owner="test-orchestrator",
            model_name=info.model_id,
        )
        self.admission = Admission(cfg.max_concurrent)
        self.servicer = OrchestratorServicer(self.deps, self.pair, self.admission)
        self.app = GrpcApp(ORCH_NAME, cfg.server)
        port = await self.app.start(
            lambda s: orchestrator_pb2_grpc.add_OrchestratorServicer_to_server(self.servicer, s)
        )
        await self.app.set_serving(True)
        self.address = f"127.0.0.1:{port}"
        self.tokenizer = tokenizer

    def stub(self) -> tuple[grpc.Channel, orchestrator_pb2_grpc.OrchestratorStub]:
        channel = grpc.insecure_channel(self.address)
        return channel, orchestrator_pb2_grpc.OrchestratorStub(channel)

    def stop(self) -> None:
        """Stop the servers, close the orchestrator's channels and Redis client, cancel what is left on
        the loop and close it (a stopped loop left open keeps its gRPC calls alive in the process)."""

        async def _stop() -> None:
            for app in (self.app, self.draft_app, self.target_app):
                await app.server.stop(grace=None)
            runner = self.deps.runner
            for pool in (runner.draft, runner.target):
                if pool is not None:
                    await pool.close()
            await self.deps.store.close()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.call(_stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


@contextlib.contextmanager
def tiny_stack(directory: Path, prompts: list[str], redis_url: str) -> Iterator[InProcessStack]:
    """A tiny draft/target pair (make_tiny_pair) served in process, with a real orchestrator and Redis."""
    target_dir, draft_dir = make_tiny_pair(directory, prompts)
    with served_pair(target_dir, draft_dir, redis_url) as stack:
        yield stack


@contextlib.contextmanager
def served_pair(target_dir: Path, draft_dir: Path, redis_url: str) -> Iterator[InProcessStack]:
    """An InProcessStack serving this target/draft pair, stopped on exit."""
    stack = InProcessStack(target_model=str(target_dir), draft_model=str(draft_dir), redis_url=redis_url).start()
    try:
        yield stack
    finally:
        stack.stop()


def tiny_pair_and_reference(directory: Path, prompts: list[str], noise: float = TINY_NOISE) -> tuple[Path, Path, Any]:
    """make_tiny_pair, plus the target loaded with transformers: the reference identity tests compare with."""
    from transformers import AutoModelForCausalLM

    target_dir, draft_dir = make_tiny_pair(directory, prompts, noise=noise)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    return target_dir, draft_dir, model


def target_greedy(model: Any, ids: list[int], max_new_tokens: int, eos_ids: list[int]) -> list[int]:
    """Plain target greedy decoding with HF generate (the reference every identity test uses)."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos_ids),
            pad_token_id=eos_ids[0],
            top_k=None,
            top_p=None,
            temperature=None,
        )
    return out[0, len(ids) :].tolist()


def reference_key(spec: str) -> str:
    """The tests.worker_pool.per_process key of the reference model `spec` (a test lends the one it loaded)."""
    return f"reference:{spec}"


def _load_reference(spec: str) -> Any:
    from specdec.models.loader import LoadConfig, load_causal_lm

    model = load_causal_lm(spec, LoadConfig(device="cpu", dtype="float32")).model
    torch.set_num_threads(1)  # the loader sets the service default
    return model


def reference_greedy(spec: str, max_new_tokens: int, eos_ids: tuple[int, ...], ids: list[int]) -> list[int]:
    """target_greedy of the reference model `spec` (fp32 on CPU, one torch thread): the one lent in this process,
    else loaded once per process (a pool worker, tests/worker_pool.py)."""
    model = per_process(reference_key(spec), lambda: _load_reference(spec))
    return target_greedy(model, ids, max_new_tokens, list(eos_ids))


def divergence(model: Any, prompt_ids: list[int], got: list[int], want: list[int], tie_epsilon: float = 1e-4) -> str:
    """ "" when equal, "tie" when they first differ where the target's top-2 logits are within
    tie_epsilon (a (k+1)-token forward may round differently from one-token steps), else a message."""
    j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if j is None:
        return "" if len(got) == len(want) else f"lengths differ: {len(got)} vs {len(want)}"
    if j >= min(len(got), len(want)):
        return f"lengths differ: {len(got)} vs {len(want)}"
    if top2_gap(model, prompt_ids + want[:j]) < tie_epsilon:
        return "tie"
    return f"diverged at {j}: got {got[j : j + 5]} want {want[j : j + 5]}"


def top2_gap(model: Any, ids: list[int]) -> float:
    """Gap between the two largest next-token logits of `model` after `ids`."""
    with torch.inference_mode():
        top = torch.topk(model(torch.tensor([ids])).logits[0, -1], 2).values
    return float(top[0] - top[1])


def wait_for_status(address: str, want_serving: bool, wait_s: float = 60.0) -> str:
    """Poll a service's health until it is (not) SERVING and reachable; its status string."""
    from specdec.healthcheck import check

    deadline, status = time.monotonic() + wait_s, ""
    while time.monotonic() < deadline:
        ok, status = check(address, timeout=1.0)
        if ok == want_serving and not status.startswith("UNAVAILABLE"):
            return status
        time.sleep(0.3)
    raise AssertionError(f"{address} never became {'SERVING' if want_serving else 'NOT_SERVING'} ({status})")


def refused_generate(cfg: Any, request: Any, timeout: float = 60.0) -> Any:
    """Start target, draft and orchestrator of `cfg` (a StackConfig with redis_url) without waiting for
    the pair to be accepted, check the orchestrator goes NOT_SERVING, send `request`; return the
    grpc.RpcError it fails with (AssertionError when it succeeds)."""
    from specdec.launcher import LocalStack
    from specdec.v1 import orchestrator_pb2_grpc

    stack = LocalStack(cfg)
    try:
        target, draft = stack.start_target(), stack.start_draft()
        stack.wait_ready(target)
        stack.wait_ready(draft)
        orch = stack._spawn(
            "orchestrator",
            [
                "--target",
                target.address,
                "--draft",
                draft.address,
                "--redis-url",
                cfg.redis_url,
                "--tokenizer",
                cfg.target_model,
            ],
        )
        assert wait_for_status(orch.address, want_serving=False) == "NOT_SERVING"
        with grpc.insecure_channel(orch.address) as channel:
            try:
                orchestrator_pb2_grpc.OrchestratorStub(channel).Generate(request, timeout=timeout)
            except grpc.RpcError as err:
                return err
    finally:
        stack.stop()
    raise AssertionError("the orchestrator served a refused pair")


TINY_LLAMA_VOCAB = 64


def tiny_llama() -> Any:
    """A 2-layer Llama with grouped KV heads (4 query, 2 KV), seeded, in eval mode: the KV-cache unit tests' model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=TINY_LLAMA_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    return model.eval()


def full_logits(model: Any, ids: list[int]) -> torch.Tensor:  # [len(ids), V]
    """Logits of one whole forward over ids, no cache: the reference cached runs are compared with."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()
