"""A seed over HTTP means one output: the same reply on every repeat, with the prompt cached or
not, beside other requests, and the same as target-only sampling with that seed (the server's
adaptive default; runtime/sampling/draws.py `Draws`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import KEY, Server


@pytest.fixture(scope="module", params=[True, False], ids=["prefix-cache", "no-prefix-cache"])
def srv(request, tiny_bundles):
    s = Server(tiny_bundles["int8"], api_key=KEY, max_batch=4, max_queue=16, prefix_cache=request.param)
    yield s
    s.stop()


def test_seeded_choices_repeat_and_equal_target_only(srv):
    kw = dict(model="int8", prompt="w5 w6 w7 w8", max_tokens=16, temperature=0.9, seed=7, n=3)
    c = srv.client()
    replies = [[ch.text for ch in sorted(c.completions.create(**kw).choices, key=lambda ch: ch.index)]
               for _ in range(3)]
    assert replies[0] == replies[1] == replies[2]
    want = [r.text for r in srv.pipe.choices("w5 w6 w7 w8", 3, chat=False, max_new_tokens=16, temperature=0.9,
                                              seed=7, draft="none", k=0)]
    assert replies[0] == want and len(set(want)) > 1


def test_seeded_requests_at_once_equal_their_target_only_output(srv):
    prompts = [f"w{i} w{i + 3} w{2 * i + 1}" for i in range(4, 12)]
    c = srv.client()

    def ask(i):
        return c.chat.completions.create(model="int8", messages=[{"role": "user", "content": prompts[i]}],
                                         max_tokens=14, temperature=1.0, top_p=0.95, seed=40 + i).choices[0].message.content

    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(ask, range(len(prompts))))
    want = [srv.pipe.generate(p, max_new_tokens=14, temperature=1.0, top_p=0.95, seed=40 + i, draft="none", k=0).text
            for i, p in enumerate(prompts)]
    assert got == want
