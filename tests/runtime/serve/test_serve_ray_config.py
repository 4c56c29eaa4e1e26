"""The Ray Serve config file and the KubeRay manifest that embeds it say the same thing, and the
config's args are options the builder knows; the options' flat form, the replicas' counters
summed, and the routers' imports (no Ray started: test_serve_ray.py deploys it)."""

from __future__ import annotations

import ast

import yaml

from paths import ROOT
from specrt.runtime.options import LoadOptions
from specrt.runtime.serve.config import SERVE_LOADING, ServeOptions
from specrt.runtime.serve.metrics import Metrics
from specrt.runtime.serve.ray.deploy import APP_NAME, RayOptions, sum_counters


def test_kuberay_manifest_embeds_the_config_file():
    config = yaml.safe_load((ROOT / "configs" / "ray_serve.yaml").read_text())
    manifest = yaml.safe_load((ROOT / "docs" / "kuberay-rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService"
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == config
    app = config["applications"][0]
    assert app["name"] == APP_NAME and app["import_path"] == "specrt.runtime.serve.ray.deploy:build"
    assert set(app["args"]) <= set(RayOptions().args())
    o = RayOptions.from_args(**app["args"])  # valid values
    assert (o.loading.threads, o.loading.max_batch, o.replicas) == (1, 4, 2)


def test_serve_options_hold_load_options_and_take_flat_args():
    """The server's and Ray's options hold one LoadOptions (the server's defaults: 8 slots,
    adaptive, one thread pool); their flat form (flags, config `args`) goes both ways."""
    o = ServeOptions.from_args(engines="b", max_batch=2, threads=3, grace=5.0)
    assert o.loading == LoadOptions(max_batch=2, threads=3, adaptive=True, global_pool=True) and o.grace == 5.0
    assert ServeOptions().loading == SERVE_LOADING == LoadOptions(max_batch=8, adaptive=True, global_pool=True)
    r = RayOptions.from_args(replicas=2, threads=2, max_batch=3, router="pow2")
    assert RayOptions.from_args(**r.args()) == r and r.cpus == 2.0
    assert not {"threads", "max_batch", "max_queue"} & {f for f in vars(r) if f != "loading"}  # declared once


def test_ray_options_refuse_what_a_replica_cannot_take():
    import pytest

    for args, words in [(dict(max_batch="auto"), "sizes one process"), (dict(replicas=0), "replicas must be"),
                        (dict(max_queue=-1), "max_queue must be"), (dict(min_replicas=2), "go together")]:
        with pytest.raises(ValueError, match=words):
            RayOptions.from_args(**args)


def test_replica_counters_sum_kv_bytes_and_metrics_report_them():
    """Two replicas of 2 slots: KV bytes in all are the sum, a slot's are not (both hold the
    same bundle), and /metrics' kv_cache_bytes reads the summed counters (it was 0 on Ray)."""
    one = {"running": 1, "waiting": 0, "slots": 2, "kv_bytes_per_slot": 1000, "kv_bytes": 2000,
           "steps": 3, "accepted_per_position": [1, 0]}
    total = sum_counters([one, dict(one, steps=4)])
    assert (total["kv_bytes"], total["kv_bytes_per_slot"], total["slots"], total["steps"]) == (4000, 1000, 4, 7)
    text = Metrics("m", lambda: total).render().decode()
    assert 'specrt:kv_cache_bytes{model_name="m"} 4000.0' in text
    assert 'specrt:kv_cache_bytes{model_name="m"} 0.0' in Metrics("m", lambda: sum_counters([])).render().decode()


def test_the_routers_use_rays_public_api_only():
    """router.py is shipped by value into every routing process and must survive Ray upgrades:
    nothing from `ray.*._private`."""
    for name in ("router.py", "deploy.py", "affinity.py"):
        tree = ast.parse((ROOT / "runtime" / "serve" / "ray" / name).read_text())
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in mods if "_private" in m.split(".")], (name, mods)
