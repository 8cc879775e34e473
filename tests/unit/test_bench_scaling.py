"""The scaling bench's shapes (bench.bench_scaling): how `--shapes` is read and refused, and each
shape's figure against the first. The processes themselves run only in `python -m bench scaling`."""

from __future__ import annotations

import argparse

import pytest

from bench.bench_scaling import figures_of, main, shape_of, shapes_of


def test_shapes_are_schedulers_by_executors_in_the_order_given() -> None:
    assert shapes_of("1x1,1x4, 2x2") == [(1, 1), (1, 4), (2, 2)]
    assert shape_of("2x4") == (2, 4)


@pytest.mark.parametrize("text", ["1", "x2", "2x", "0x1", "1x0", "ax2", "1x2x3", "-1x2"])
def test_a_malformed_shape_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="shape"):
        shape_of(text)


def test_the_command_line_refuses_a_bad_shape_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--shapes", "1x1,2y2"])
    assert ended.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--shapes" in err and "2y2" in err
    with pytest.raises(SystemExit) as ended:
        main(["--shapes", ","])
    assert ended.value.code != 0


def test_each_shape_is_reported_against_the_first_shape_measured() -> None:
    def found(s: int, e: int, rate: float) -> dict[str, object]:
        return {"steps_per_s": rate, "schedulers": s, "executors": e, "cpu_ms_per_step": {"total": 2.0}}

    figures = figures_of([found(1, 1, 800.0), found(1, 2, 1000.0), found(2, 4, 600.0)])
    assert [f["figure"] for f in figures] == ["steps_per_s_1_schedulers_1_executors",
                                              "steps_per_s_1_schedulers_2_executors",
                                              "steps_per_s_2_schedulers_4_executors"]
    assert [f["ratio"] for f in figures] == [1.0, 1.25, 0.75]
    assert {f["baseline"] for f in figures} == {800.0}
    assert all(f["bench"] == "scaling" and f["unit"] == "steps/s" for f in figures)
    assert figures[2]["value"] == 600.0 and figures[2]["cpu_ms_per_step"] == {"total": 2.0}
