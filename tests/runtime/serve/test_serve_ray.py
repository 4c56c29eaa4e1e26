"""`specrt serve --replicas N` on a local Ray instance: two engine replicas of a tiny bundle
(0.5 CPU each) behind the ingress, driven over HTTP through Ray's proxy. One Ray start for the
module (the CLI's SIGTERM test, first, starts and stops its own)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import ray
from ray import serve
from test_serve import _free_port, _serve_proc, _solo, _streams_through_sigterm, _wait_healthy

import specrt
from paths import ROOT
from specrt.runtime.serve.ray.deploy import APP_NAME, REPLICA_HEADER, build

pytestmark = pytest.mark.ray

CONFIG = ROOT / "configs" / "ray_serve.yaml"
H = {"Content-Type": "application/json"}


def _marked(mark: str) -> list[psutil.Process]:
    """Processes of this user whose environment carries `mark` (a Ray instance's every process
    inherits it from the command that started it)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SPECRT_TEST_MARK") == mark:
                out.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return out


def test_sigterm_drains_the_replicas_exits_zero_and_leaves_no_ray(tiny_bundles):
    port, mark = _free_port(), uuid.uuid4().hex
    url = f"http://127.0.0.1:{port}"
    os.environ["SPECRT_TEST_MARK"] = mark  # inherited by the CLI and every Ray process it starts
    try:
        proc = _serve_proc(tiny_bundles["none"], port, "--replicas", "2", "--replica-cpus", "0.5", "--threads", "1",
                           "--max-batch", "2", "--grace", "20", "--draft", "none")
    finally:
        del os.environ["SPECRT_TEST_MARK"]
    try:
        _wait_healthy(url, proc, timeout=240)
        bodies = [{"model": "none", "prompt": f"w{5 + i} w6", "max_tokens": 200, "stream": True, "ignore_eos": True,
                   "stream_options": {"include_usage": True}} for i in range(2)]
        results = _streams_through_sigterm(url, proc, bodies, timeout=120)
        for lines in results.values():  # drained: each ran to its end
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 200
        deadline = time.time() + 30  # ray.shutdown has returned; its processes may take a moment to exit
        while _marked(mark) and time.time() < deadline:
            time.sleep(0.5)
        assert not [p.name() for p in _marked(mark)]
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _marked(mark):
            p.kill()


# ---- one Ray instance for the rest of the module --------------------------------------------

class RaySrv:
    def __init__(self, bundle: Path):
        self.bundle = bundle
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = dict(engines=str(bundle), replicas=2, replica_cpus=0.5, threads=1, max_batch=2, max_queue=2,
                         draft="none", grace=5)
        os.environ["SPECRT_ENGINES"] = str(bundle)  # the config file's bundle, as the replicas see it
        ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        serve.run(build(self.args), name=APP_NAME, route_prefix="/")
        self.wait_replicas(2)

    def health(self) -> dict:
        try:
            r = httpx.get(self.url + "/health", timeout=5)
            return r.json() | {"code": r.status_code}
        except httpx.HTTPError:
            return {"code": None}

    def wait_replicas(self, n: int, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            h = self.health()
            if h["code"] == 200 and h.get("replicas") == n:
                return
            time.sleep(0.5)
        raise AssertionError(f"{n} replicas not ready: {self.health()}")

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + "{"))

    def complete(self, prompt: str, n: int, **kw) -> httpx.Response:
        return httpx.post(self.url + "/v1/completions", json={"model": "none", "prompt": prompt, "max_tokens": n,
                                                             "temperature": 0, **kw}, timeout=120)

    def stop(self):
        serve.shutdown()
        ray.shutdown()
        os.environ.pop("SPECRT_ENGINES", None)


@pytest.fixture(scope="module")
def rs(tiny_bundles):
    s = RaySrv(tiny_bundles["none"])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def solo(tiny_bundles):
    with specrt.load(tiny_bundles["none"], max_batch=1, draft="none", prefix_cache=False) as pipe:
        yield pipe


def _replicas_answering_as_one(rs, solo, prompts: list[str], n: int) -> set[str]:
    """Each prompt's completion through the replicas equals one process's greedy text;
    -> the replicas that answered."""
    seen = set()
    for prompt in prompts:
        r = rs.complete(prompt, n)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == _solo(solo, prompt, n, chat=False).text
        seen.add(r.headers[REPLICA_HEADER])
    return seen


def test_both_replicas_serve_and_greedy_equals_one_process(rs, solo):
    # prompts that share nothing: spread over the replicas
    assert len(_replicas_answering_as_one(rs, solo, [f"w{10 + i} w{30 + i} w{50 + i}" for i in range(6)], 16)) == 2
    c = openai.OpenAI(base_url=rs.url + "/v1", api_key="x")
    out = c.chat.completions.create(model="none", messages=[{"role": "user", "content": "w7 w8"}], max_tokens=12,
                                    temperature=0)
    assert out.choices[0].message.content == _solo(solo, "w7 w8", 12).text


def test_seeded_sampling_through_replicas_equals_one_process(rs, solo):
    """A seed gives one output wherever it runs: the same sampled text from whichever replica
    (cached prompt or not) as from one process."""
    prompt = "w21 w22 w23"
    want = solo.generate(prompt, chat=False, max_new_tokens=14, temperature=1.0, seed=11, draft="none").text
    got = {rs.complete(prompt, 14, temperature=1.0, seed=11).json()["choices"][0]["text"] for _ in range(4)}
    assert got == {want}


def test_streaming_through_the_proxy_ends_with_done(rs, solo):
    body = {"model": "none", "prompt": "w5 w6", "max_tokens": 10, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", rs.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers[REPLICA_HEADER]
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == _solo(solo, "w5 w6", 10, chat=False).text
    assert chunks[-1]["usage"]["completion_tokens"] == 10


def test_errors_are_the_single_process_servers(rs):
    r = httpx.post(rs.url + "/v1/completions", json={"model": "none", "prompt": "w5", "temperature": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(rs.url + "/v1/completions", json={"model": "gpt-4", "prompt": "w5"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = rs.complete("w5", 100_000)  # refused by the engine replica: its error value, with the replica named
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and r.headers[REPLICA_HEADER]


def test_a_conversations_next_turn_goes_where_its_prefix_is(rs):
    c = openai.OpenAI(base_url=rs.url + "/v1", api_key="x")
    system = " ".join(f"w{3 + i % 90}" for i in range(80))  # > two 32-token blocks
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "w5 w6 w7"}]
    first = c.chat.completions.with_raw_response.create(model="none", messages=msgs, max_tokens=8, temperature=0)
    msgs += [{"role": "assistant", "content": first.parse().choices[0].message.content},
             {"role": "user", "content": "w8 w9"}]
    for _ in range(3):
        nxt = c.chat.completions.with_raw_response.create(model="none", messages=msgs, max_tokens=8, temperature=0)
        assert nxt.headers[REPLICA_HEADER] == first.headers[REPLICA_HEADER]
        assert nxt.parse().usage.prompt_tokens_details.cached_tokens >= first.parse().usage.prompt_tokens - 1


def test_metrics_sum_the_replicas_engine_counters(rs):
    rs.complete("w20 w21", 8)
    deadline = time.time() + 30  # replicas report every second
    while rs.metric("specrt:engine_steps_total") == 0 and time.time() < deadline:
        time.sleep(0.5)
    assert rs.metric("specrt:engine_steps_total") > 0
    assert rs.metric("specrt:num_slots") == 4  # 2 replicas x 2 slots
    with specrt.load(rs.bundle, max_batch=2, draft="none", hugepages=False) as one:  # one replica's load
        assert rs.metric("specrt:kv_cache_bytes") == 2 * one.kv_bytes > 0  # was 0: built without it
    assert rs.metric("specrt:generation_tokens_total") > 0  # the ingress's own counts


def test_client_disconnect_cancels_in_the_replica(rs):
    def settled_rows() -> float:  # the replicas report every second: wait for two equal readings
        last, deadline = None, time.time() + 60
        while time.time() < deadline:
            time.sleep(1.5)
            now = (rs.metric("specrt:engine_step_rows_total"), rs.metric("specrt:num_requests_running"))
            if now == last and now[1] == 0:
                break
            last = now
        return now[0]

    before = settled_rows()
    body = {"model": "none", "prompt": "w5 w6", "max_tokens": 240, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", rs.url + "/v1/completions", json=body, timeout=60) as r:
        next(r.iter_lines())  # the first chunk arrived: the request runs in its replica
    assert settled_rows() - before < 240  # cut short, not run to the end


def test_a_full_queue_gives_503_with_retry_after(rs, solo):
    want = _solo(solo, "w5 w6", 60, chat=False, ignore_eos=True).text

    async def burst():
        c = openai.AsyncOpenAI(base_url=rs.url + "/v1", api_key="x", max_retries=0, timeout=120)

        async def one():
            try:
                r = await c.completions.create(model="none", prompt="w5 w6", max_tokens=60, temperature=0,
                                               extra_body={"ignore_eos": True})
                return r.choices[0].text
            except openai.APIStatusError as e:
                assert e.status_code == 503 and e.response.headers.get("retry-after"), e.response.text
                assert e.body["code"] == "queue_full"
                return 503

        return await asyncio.gather(*(one() for _ in range(12)))  # 2 x 2 slots + 2 queued < 12

    out = asyncio.run(burst())
    assert 503 in out and all(o in (want, 503) for o in out) and want in out


def test_a_killed_replica_is_survived(rs, solo):
    results: dict = {}
    started = [threading.Event() for _ in range(2)]

    def stream(i):
        body = {"model": "none", "prompt": f"w{60 + i}", "max_tokens": 240, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", rs.url + "/v1/completions", json=body, timeout=120) as r:
                results[i] = {"replica": r.headers[REPLICA_HEADER], "lines": []}
                for ln in r.iter_lines():
                    started[i].set()
                    if ln:
                        results[i]["lines"].append(ln)
        except httpx.HTTPError as e:  # an ended connection is a clear error too, not a hang
            results.setdefault(i, {})["error"] = repr(e)
            started[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    assert all(e.wait(60) for e in started)
    victim = results[0]["replica"]
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#SpecrtEngine#{victim}", namespace="serve"), no_restart=True)
    for t in threads:
        t.join(120)
        assert not t.is_alive()  # every client got an answer or an ended stream
    lines = results[0].get("lines", [])
    assert "error" in results[0] or (lines[-1] == "data: [DONE]" and "replica_failed" in lines[-2])
    rs.wait_replicas(2)  # Ray started a new one
    for i in range(4):
        r = rs.complete(f"w{70 + i} w9", 8)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == _solo(solo, f"w{70 + i} w9", 8, chat=False).text


def test_the_config_file_deploys(rs, solo):
    """configs/ray_serve.yaml as it is, through Ray's own `serve run` (the bundle: the
    $SPECRT_ENGINES the replicas inherited); it replaces the module's application."""
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    out = subprocess.run([str(Path(sys.executable).parent / "serve"), "run", "--non-blocking", str(CONFIG)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    deadline = time.time() + 240
    while time.time() < deadline:
        st = serve.status().applications.get(APP_NAME)
        if st is not None and st.status == "RUNNING" and st.deployments["SpecrtEngine"].replica_states.get("RUNNING"):
            break
        time.sleep(1)
    rs.wait_replicas(2)
    r = rs.complete("w5 w6 w7", 8)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == _solo(solo, "w5 w6 w7", 8, chat=False).text


def test_the_pow2_router_serves_through_public_api(rs, solo):
    """`--router pow2` (router.py's PowerOfTwoRouter over Ray's public request-router API)
    deploys, spreads requests over both replicas and answers as one process does; it replaces
    the module's application (run last)."""
    serve.run(build(dict(rs.args, router="pow2")), name=APP_NAME, route_prefix="/")
    rs.wait_replicas(2)
    assert len(_replicas_answering_as_one(rs, solo, [f"w{80 + i} w{40 + i}" for i in range(12)], 6)) == 2
