# Source this at the start of a command on the lent GPU machine (the `device` tool), from the
# repository's root:  . tools/device-env.sh
# There fusecut runs from its source tree without an install: this installs the carried wheels
# (.whl/, from ../shared/tools/device-wheels.sh) into $DEVICE_SITE, writes fusecut's entry
# points there as installed metadata (torch.compile finds backend="fusecut" through them), and
# puts the site, tools/devpath (fusecut = clients/) and the root (benchmarks, tests) on
# PYTHONPATH.
DEVICE_SITE="${DEVICE_SITE:-/tmp/site}"
DEVICE_WHEELS="${DEVICE_WHEELS:-.whl}"
if ls "$DEVICE_WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEVICE_SITE" \
    "$DEVICE_WHEELS"/*.whl >/dev/null 2>&1 || echo "device-env: a carried wheel did not install" >&2
fi
python3 - "$DEVICE_SITE" <<'PY'
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
info = pathlib.Path(sys.argv[1]) / "fusecut-0.dev0.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text("Metadata-Version: 2.1\nName: fusecut\nVersion: 0.dev0\n")
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
    for group, points in project.get("entry-points", {}).items()))
PY
export PYTHONPATH="$DEVICE_SITE:$PWD/tools/devpath:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
