"""Every plan option is declared once (``optimizer.options``); these tests hold each path that
takes options to that declaration: ``PlanOptions`` (the SDK and the planner), ``SolverOptions``,
the HTTP request model and its published JSON Schema, the service's settings and the command
line. A default, bound or choice changed on one path only fails here."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import pytest
import typer
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema
from typer.testing import CliRunner

from fusecut.cli import app
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.options import (
    BY_NAME,
    DEVICE,
    DEVICE_FIELDS,
    DEVICE_OVERRIDES,
    KINDS,
    PLAN_OPTIONS,
    SEGMENTER,
    TIME_LIMIT_S,
    Option,
    Range,
)
from fusecut.optimizer.planner import SEGMENTERS, PlanOptions
from fusecut.optimizer.profiles import PROFILES, TUNING_FIELDS, DeviceProfile, get_profile
from fusecut.optimizer.segmenters.result import SolverOptions
from fusecut.service.models import DeviceOverrides, PlanOptionsModel, PlanRequest
from fusecut.service.planning import plan_options
from fusecut.service.problems import Problem
from fusecut.service.settings import Settings

# The command line's `plan` flags, by the option each sets.
CLI_FLAGS = {"segmenter": "--segmenter", "time_limit_s": "--time-limit", "device": "--device",
             "num_streams": "--num-streams"}
NUMBERS = [o for o in PLAN_OPTIONS if o.range is not None]
FIELDS = [f for f in DEVICE_FIELDS if f.range is not None]


def outside(option: Option) -> list:
    """Values just past each end of a number option's range (and its end where open)."""
    r = option.range
    step = 1 if option.type is int else max(abs(r.high), 1) * 1e-9
    below = [r.low] if r.low_open else [r.low - (1 if option.type is int else abs(r.low) * 0.5
                                                 or 1e-9)]
    return below + [r.high + step]


def inside(option: Option) -> list:
    """A number option's closed ends, and a value just inside an open one."""
    r = option.range
    low = (r.low + min(1e-3, r.high)) if r.low_open else r.low
    return [low, r.high]


def wire(options: dict, settings: Settings | None = None) -> PlanOptions:
    """The service's path: a request's options JSON, parsed and made PlanOptions."""
    model = PlanOptionsModel.model_validate_json(json.dumps(options))
    return plan_options(model, settings or Settings(db_path=":memory:", max_solver_seconds=600))


def cli(*args: str):
    """The `plan` command's answer (refused before the file is read: no such file is needed)."""
    return CliRunner().invoke(app, ["plan", "/nonexistent/fusion.py", *args])


def cli_params() -> dict:
    plan = typer.main.get_command(app).commands["plan"]
    return {p.opts[0]: p for p in plan.params if p.opts}


def schema_of(model) -> dict:
    _, top = models_json_schema([(model, "validation")], ref_template="#/$defs/{model}")
    return top["$defs"][model.__name__]


def number_schema(prop: dict) -> dict:
    """The non-null branch of an optional property."""
    return next((b for b in prop.get("anyOf", []) if b.get("type") != "null"), prop)


# ---- the declaration -----------------------------------------------------------------------

def test_the_declaration_names_every_field_of_plan_options_in_order():
    assert [f.name for f in fields(PlanOptions)] == [o.name for o in PLAN_OPTIONS]
    assert list(PlanOptionsModel.model_fields) == [o.name for o in PLAN_OPTIONS]
    assert list(PlanOptions().to_json()) == [o.name for o in PLAN_OPTIONS]
    for option in PLAN_OPTIONS:
        assert option.description, option.name


def test_choices_come_from_what_they_name():
    assert SEGMENTERS == SEGMENTER.choices
    for name in SEGMENTER.choices:
        assert name in SEGMENTER.description
    assert DEVICE.choices == tuple(PROFILES) and DEVICE.default in PROFILES
    assert KINDS.choices == tuple(k.value for k in Kind) == KINDS.default
    # every field of a device profile but its name and its kernel tunings may be overridden,
    # and nothing else
    assert {f.name for f in DEVICE_FIELDS} == \
        {f.name for f in fields(DeviceProfile)} - {"name"} - TUNING_FIELDS
    for f in DEVICE_FIELDS:  # the built-in profiles are within the bounds a request must keep
        for profile in PROFILES.values():
            PlanOptions(device_overrides={f.name: getattr(profile, f.name)})


def test_every_default_is_a_value_its_option_takes():
    default = PlanOptions()
    for option in PLAN_OPTIONS:
        assert getattr(default, option.name) == option.default, option.name


# ---- PlanOptions and SolverOptions -----------------------------------------------------------

@pytest.mark.parametrize("option", NUMBERS, ids=lambda o: o.name)
def test_plan_options_refuse_each_number_past_its_range_naming_it(option):
    for value in outside(option) + [math.nan, math.inf, True, "1"]:
        with pytest.raises(PlanError) as e:
            PlanOptions(**{option.name: value})
        text = str(e.value)
        assert text.startswith(f"{option.name} must be") and str(option.range) in text, text
        assert f"got {value!r}" in text, text
    for value in inside(option):
        assert getattr(PlanOptions(**{option.name: value}), option.name) == value


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_plan_options_refuse_each_device_override_past_its_range(field):
    for value in outside(field):
        with pytest.raises(PlanError) as e:
            PlanOptions(device_overrides={field.name: value})
        assert str(e.value).startswith(f"device_overrides.{field.name} must be") and \
            str(field.range) in str(e.value), e.value
    for value in inside(field):
        assert PlanOptions(device_overrides={field.name: value}).device_overrides == {
            field.name: value}


def test_plan_options_refuse_what_no_choice_names():
    with pytest.raises(PlanError, match="segmenter must be one of cpsat, greedy or mincut, got "
                                        "'magic'"):
        PlanOptions(segmenter="magic")
    with pytest.raises(PlanError, match="device must be one of H100, H200 or A100"):
        PlanOptions(device="TPU")
    assert PlanOptions(device="a100").device == "a100"  # any case, kept as given (its key)
    with pytest.raises(PlanError, match="device must be .* got 'HHHH"):
        PlanOptions(device="H" * (DEVICE.max_length + 1))
    with pytest.raises(PlanError, match="kinds must be .*unknown: warp"):
        PlanOptions(kinds=("warp", "library", "fallback"))
    with pytest.raises(PlanError, match="library and fallback may not be left out"):
        PlanOptions(kinds=["pointwise"])
    with pytest.raises(PlanError, match="device_overrides must be .*unknown: warp_size"):
        PlanOptions(device_overrides={"warp_size": 64})
    with pytest.raises(PlanError, match=r"device_overrides\.arch must be a string matching"):
        PlanOptions(device_overrides={"arch": "sm_90; rm -rf"})


def test_equal_options_make_the_same_json_and_so_the_same_plan_key():
    # PlanOptions.to_json feeds the plan's key: 5 and 5.0, a list and a tuple are one key
    assert PlanOptions(time_limit_s=5, launch_weight=1, kinds=list(KINDS.default)).to_json() == \
        PlanOptions().to_json()
    assert json.dumps(PlanOptions(device_overrides={"bandwidth": 2 * 10**12}).to_json()) == \
        json.dumps(PlanOptions(device_overrides={"bandwidth": 2e12}).to_json())
    # the default options' JSON, as plans stored before the declaration have it
    assert json.dumps(PlanOptions().to_json()) == (
        '{"segmenter": "cpsat", "time_limit_s": 5.0, "device": "H100", "device_overrides": {}, '
        '"launch_weight": 1.0, "compute_weight": 1.0, "seed": 0, "kinds": ["fallback", '
        '"inner_outer", "library", "normalization", "pointwise", "reduction"], '
        '"num_streams": 4}')


def test_solver_options_are_declared_plan_options_with_their_defaults():
    for f in fields(SolverOptions):
        option = BY_NAME[f.name]
        assert f.default == option.default and f.type == option.type.__name__, f.name
    assert PlanOptions().solver == SolverOptions()


# ---- the HTTP request model and its JSON Schema ----------------------------------------------

def test_the_request_model_publishes_the_declaration():
    props = schema_of(PlanOptionsModel)["properties"]
    nested = schema_of(DeviceOverrides)
    assert nested["description"] == DEVICE_OVERRIDES.description
    declared = [(o, props[o.name]) for o in PLAN_OPTIONS if o.type is not dict] + \
        [(f, nested["properties"][f.name]) for f in DEVICE_FIELDS]
    for option, prop in declared:
        assert prop["description"] == option.description, option.name
        branch = number_schema(prop)
        if option.range is not None:
            low = "exclusiveMinimum" if option.range.low_open else "minimum"
            assert (branch[low], branch["maximum"]) == (option.range.low, option.range.high)
        assert branch.get("maxLength") == option.max_length, option.name
        assert branch.get("pattern") == option.pattern, option.name
    assert props["segmenter"]["enum"] == list(SEGMENTER.choices)
    # absent: the service's default time limit, every kind
    assert props["time_limit_s"]["default"] is None and props["kinds"]["default"] is None


@pytest.mark.parametrize("option", NUMBERS, ids=lambda o: o.name)
def test_the_request_model_refuses_each_number_past_its_range_naming_it(option):
    for value in outside(option):
        with pytest.raises(ValidationError) as e:
            wire({option.name: value})
        assert [err["loc"] for err in e.value.errors()] == [(option.name,)], e.value
    for value in inside(option):
        assert getattr(wire({option.name: value}), option.name) == value


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_the_request_model_refuses_each_device_override_past_its_range(field):
    for value in outside(field):
        with pytest.raises(ValidationError) as e:
            wire({"device_overrides": {field.name: value}})
        assert [err["loc"] for err in e.value.errors()] == [("device_overrides", field.name)]
    for value in inside(field):
        assert wire({"device_overrides": {field.name: value}}).device_overrides == {
            field.name: value}


def test_what_the_request_model_lets_through_the_planner_refuses_naming_it():
    for options, message in (({"device": "TPU"}, "device must be one of"),
                             ({"kinds": ["pointwise"]}, "kinds must be"),
                             ({"kinds": ["x", "library", "fallback"]}, "unknown: x")):
        with pytest.raises(PlanError, match=message):
            wire(options)


def test_the_request_model_defaults_are_the_declared_defaults():
    assert wire({}) == PlanOptions()
    model = PlanOptionsModel()
    for option in PLAN_OPTIONS:
        value = getattr(model, option.name)
        if option.type is dict:
            assert value.model_dump(exclude_none=True) == dict(option.default)
        elif option.name in ("time_limit_s", "kinds"):
            assert value is None  # the service's default, every kind
        else:
            assert value == option.default, option.name


def test_a_default_request_keeps_its_request_key():
    # POST /v1/plan bodies are looked up by the hash of this text: it must not change
    assert PlanRequest.model_validate({"definition": "x"}).model_dump_json() == (
        '{"definition":"x","inputs":null,"options":{"segmenter":"cpsat","time_limit_s":null,'
        '"device":"H100","device_overrides":{"bandwidth":null,"sm_count":null,'
        '"smem_per_block":null,"launch_overhead_s":null,"persistent_budget":null,'
        '"compute_rate":null,"arch":null},"launch_weight":1.0,"compute_weight":1.0,"seed":0,'
        '"kinds":null,"num_streams":4}}')


# ---- the service's settings --------------------------------------------------------------------

def test_the_service_may_lower_the_time_limit_never_raise_it():
    settings = Settings(db_path=":memory:")
    assert settings.default_time_limit_s == TIME_LIMIT_S.default
    assert settings.max_solver_seconds <= TIME_LIMIT_S.range.high
    assert wire({}, settings).time_limit_s == TIME_LIMIT_S.default
    with pytest.raises(ValueError, match=r"FUSECUT_MAX_SOLVER_SECONDS\) must be in \(0, 600\]"):
        Settings(db_path=":memory:", max_solver_seconds=TIME_LIMIT_S.range.high + 1)
    with pytest.raises(ValueError, match=r"FUSECUT_DEFAULT_TIME_LIMIT_S\) must be in \(0, 3\]"):
        Settings(db_path=":memory:", max_solver_seconds=3)  # the declared 5 s is too long
    lowered = Settings(db_path=":memory:", max_solver_seconds=3, default_time_limit_s=2)
    assert wire({}, lowered).time_limit_s == 2
    with pytest.raises(Problem, match=r"at most 3 .*own range is \(0, 600\]"):
        wire({"time_limit_s": 4}, lowered)
    top = Settings(db_path=":memory:", max_solver_seconds=TIME_LIMIT_S.range.high)
    assert wire({"time_limit_s": TIME_LIMIT_S.range.high}, top).time_limit_s == 600


# ---- the command line ------------------------------------------------------------------------

def test_the_command_line_defaults_and_help_are_the_declared_ones():
    params = cli_params()
    for name, flag in CLI_FLAGS.items():
        option = BY_NAME[name]
        assert params[flag].default == option.default, flag
        assert option.description in params[flag].help, flag
        if option.range is not None:
            assert str(option.range) in params[flag].help, flag


@pytest.mark.parametrize("name", [n for n in CLI_FLAGS if n in {o.name for o in NUMBERS}])
def test_the_command_line_refuses_each_number_past_its_range_naming_it(name):
    option = BY_NAME[name]
    for value in outside(option):
        r = cli(CLI_FLAGS[name], str(value))
        assert r.exit_code == 2, r.output
        text = " ".join(r.output.split())
        assert f"'{CLI_FLAGS[name]}'" in text and f"{name} must be" in text and \
            str(option.range) in text, text
    for value in inside(option):  # taken: the command goes on to read the (missing) file
        r = cli(CLI_FLAGS[name], str(value))
        assert "cannot read /nonexistent/fusion.py" in " ".join(r.output.split()), r.output


def test_the_command_line_refuses_what_no_choice_names():
    for flag, value, message in (("--segmenter", "magic", "segmenter must be one of"),
                                 ("--device", "TPU", "device must be one of")):
        r = cli(flag, value)
        assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output
    r = cli("--device", "h200", "--segmenter", "greedy")
    assert "cannot read" in r.output


def test_range_text():
    assert str(Range(0, 600, low_open=True)) == "(0, 600]"
    assert str(Range(1e9, 1e15)) == "[1e+09, 1e+15]"
    assert not Range(0, 1).holds(math.nan)


def test_get_profile_stays_a_plain_constructor():
    # below a request's bounds: tests and tools build profiles a request may not ask for
    assert get_profile("H100", {"persistent_budget": 64}).persistent_budget == 64
