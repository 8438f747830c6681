"""onnx.checker's full check (with shape and type inference) of each model file given; prints {file: verdict} as JSON.

Used by the corpus regression net (test/support/corpus-net.ts) as a validator from outside this project: Debian's
python3-onnx. Where a file's IR version is newer than this onnx knows, the check runs on a copy that claims the
newest IR version it knows, and the verdict says so: the operators and types are what is checked, and the IR
versions after 8 added types (float8, 4-bit) and function overloads that these checks do not need unless the file uses them.
"""
import json
import sys

import onnx
from onnx import checker


def verdict(path):
    try:
        model = onnx.load(path)
        note = ''
        if model.ir_version > onnx.IR_VERSION:
            note = f' (checked as IR {onnx.IR_VERSION}; the file is IR {model.ir_version})'
            model.ir_version = onnx.IR_VERSION
        checker.check_model(model, full_check=True)
        return 'ok' + note
    except Exception as e:  # every failure is a verdict, not a crash of the check
        lines = str(e).strip().splitlines()
        return f'{type(e).__name__}: {lines[0] if lines else ""}'[:300]


if __name__ == '__main__':
    print(json.dumps({path: verdict(path) for path in sys.argv[1:]}, indent=1))
