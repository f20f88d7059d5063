"""orchestrator/affinity.py: the turns of one conversation share a routing key; other conversations do not."""

from __future__ import annotations

from orchestrator.affinity import ConversationRoutes, conversation_key, routed_by
from specdec.v1 import orchestrator_pb2 as pb

CHARS = 64


def chat(*messages: tuple[str, str]) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    for role, content in messages:
        req.messages.messages.add(role=role, content=content)
    return req


def test_every_turn_of_a_conversation_resent_whole_has_the_first_turns_key():
    first = chat(("system", "Be brief."), ("user", "Name a prime."))
    second = chat(("system", "Be brief."), ("user", "Name a prime."), ("assistant", "7"), ("user", "Another?"))
    third = chat(*[(m.role, m.content) for m in second.messages.messages], ("assistant", "11"), ("user", "More."))
    keys = {conversation_key(r, CHARS) for r in (first, second, third)}
    assert len(keys) == 1 and keys.pop().startswith("conversation:")


def test_conversations_that_open_differently_have_different_keys():
    base = conversation_key(chat(("system", "Be brief."), ("user", "Name a prime.")), CHARS)
    assert conversation_key(chat(("system", "Be brief."), ("user", "Name a square.")), CHARS) != base
    assert conversation_key(chat(("system", "Be long."), ("user", "Name a prime.")), CHARS) != base
    assert conversation_key(chat(("user", "Name a prime.")), CHARS) != base
    # where one message ends and the next begins is part of the key
    assert conversation_key(chat(("system", "ab"), ("user", "c")), CHARS) != conversation_key(
        chat(("system", "a"), ("user", "bc")), CHARS
    )


def test_a_plain_prompt_is_keyed_by_its_opening_only_when_it_has_one_that_long():
    document = "x" * CHARS
    long_a, long_b = pb.GenerateRequest(prompt=document + " question a"), pb.GenerateRequest(prompt=document + " b")
    assert conversation_key(long_a, CHARS) == conversation_key(long_b, CHARS) != ""
    assert conversation_key(pb.GenerateRequest(prompt="short"), CHARS) == ""  # routed by its session id
    assert conversation_key(chat(("user", "hi")), 0) == conversation_key(long_a, 0) == ""  # affinity off


def test_more_generations_of_one_key_than_max_live_take_the_keys_next_routes():
    routes = ConversationRoutes()
    taken = [routes.claim("conversation:ab", 2) for _ in range(5)]
    assert taken == ["conversation:ab"] * 2 + ["conversation:ab#1"] * 2 + ["conversation:ab#2"]
    for route in taken[:4]:
        routes.release(route)
    assert routes.live("conversation:ab") == 1 and routes.claim("conversation:ab", 2) == "conversation:ab"
    routes.release("conversation:ab")
    routes.release("conversation:ab#2")
    assert routes.live("conversation:ab") == 0
    assert routes.claim("", 2) == "" and routes.live("") == 0  # no key: routed by the session id
    assert [routed_by(r) for r in ("", taken[0], taken[2])] == ["session", "conversation", "conversation_spread"]
