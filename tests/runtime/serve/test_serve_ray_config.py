"""The Ray Serve config file and the KubeRay manifest that embeds it say the same thing, and the
config's args are options the builder knows (no Ray started: test_serve_ray.py deploys it)."""

from __future__ import annotations

from dataclasses import fields

import yaml

from paths import ROOT
from specrt.runtime.serve.ray_deploy import APP_NAME, RayOptions


def test_kuberay_manifest_embeds_the_config_file():
    config = yaml.safe_load((ROOT / "configs" / "ray_serve.yaml").read_text())
    manifest = yaml.safe_load((ROOT / "docs" / "kuberay-rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService"
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == config
    app = config["applications"][0]
    assert app["name"] == APP_NAME and app["import_path"] == "specrt.runtime.serve.ray_deploy:build"
    assert set(app["args"]) <= {f.name for f in fields(RayOptions)}
    RayOptions(**app["args"])  # valid values
