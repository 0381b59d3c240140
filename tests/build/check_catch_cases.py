"""Every Catch case of tensortap_tests runs in some CTest test
(tests/CMakeLists.txt): the cases of a file in its group (unit.<file>,
unit.<file>.slow), test_hostile.cpp's each in its own (hostile.<case>).

    check_catch_cases.py TENSORTAP_TESTS BUILD_TESTS_DIR

Lists the cases by file (Catch's -# file tags) and the tests CTest knows
(ctest -N), and fails naming any case no test would run: a file left out
of the groups, or hostile cases that discovery did not register.
"""

import re
import subprocess
import sys


def listing(binary, *args):
    # Catch's listings exit with the number listed: not an error.
    return subprocess.run([binary, "-#", *args], capture_output=True, text=True).stdout


def main():
    binary, build = sys.argv[1:3]
    files = sorted(set(re.findall(r"\[#(test_[A-Za-z0-9_]+)\]", listing(binary, "--list-tags"))))
    slow = set(re.findall(r"\[#(test_[A-Za-z0-9_]+)\]", listing(binary, "[slow]", "--list-tags")))
    hostile = [line for line in listing(binary, "[#test_hostile]", "--list-test-names-only").splitlines() if line.strip()]
    out = subprocess.run(["ctest", "-N"], cwd=build, capture_output=True, text=True, check=True).stdout
    tests = set(re.findall(r"Test +#\d+: (.*)$", out, re.M))
    missing = [f"test_hostile: '{case}' has no test hostile.{case}" for case in hostile
               if f"hostile.{case}" not in tests]
    for f in files:
        name = f[len("test_"):]
        if f == "test_hostile":
            continue
        if f"unit.{name}" not in tests:
            missing.append(f"{f}: no test unit.{name}")
        if f in slow and f"unit.{name}.slow" not in tests:
            missing.append(f"{f}: its [slow] cases have no test unit.{name}.slow")
    if missing:
        sys.exit("cases no CTest test runs:\n  " + "\n  ".join(missing))
    print(f"every case of {len(files)} files runs in a CTest test ({len(tests)} tests)")


if __name__ == "__main__":
    main()
