"""The ctypes structs match strata.h's layout: a C program compiled against the header prints
every size and offset, and each must equal what ctypes computed."""
import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import ROOT
from strata import _lib

STRUCTS = {
    "strata_config": _lib.ConfigStruct,
    "strata_tensor_desc": _lib.TensorDesc,
    "strata_acquired": _lib.Acquired,
    "strata_schedule_entry": _lib.ScheduleEntry,
    "strata_stats": _lib.StatsStruct,
    "strata_tier_stats": _lib.TierStats,
    "strata_optimizer_group": _lib.OptimizerGroup,
    "strata_optimizer_options": _lib.OptimizerOptions,
    "strata_optimizer_result": _lib.OptimizerResult,
}


def test_struct_layouts_match_the_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to compile strata.h with")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <strata/strata.h>",
             "int main(void) {"]
    for cname, py in STRUCTS.items():
        lines.append(f'  printf("{cname} size %zu\\n", sizeof({cname}));')
        for field, _ in py._fields_:
            lines.append(f'  printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "runtime", "include"), str(src),
                    "-o", str(exe)], check=True)
    seen = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    expected = []
    for cname, py in STRUCTS.items():
        expected.append(f"{cname} size {ctypes.sizeof(py)}")
        for field, _ in py._fields_:
            expected.append(f"{cname} {field} {getattr(py, field).offset}")
    assert seen.split("\n")[:-1] == expected


def test_every_declared_function_is_exported():
    assert _lib.missing_symbols() == [], \
        "libstrata.so lacks functions strata.h declares: " + ", ".join(_lib.missing_symbols())
