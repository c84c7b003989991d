#!/usr/bin/python3
"""The source tree's layering, checked: every folder of src/ is a layer, and a file includes only
headers of its own folder or of a layer below it. Public headers (include/pscoro) include no header
of src/. A new folder of src/ must be placed in LAYERS before anything in it passes.

Usage: layers.py SOURCE_ROOT. Prints each include that points up or sideways as
`src/FOLDER/FILE:LINE: includes "OTHER/X.hpp", which is above/beside it (...)` and exits 1;
otherwise prints how many includes it checked and exits 0. Ends with the line "N passed, N failed"
that scripts/count_tests.py counts. docs/architecture.md explains the
layers; this list is their one definition.
"""
import pathlib
import re
import sys

# Bottom first. Folders in one row are siblings: neither may include the other.
LAYERS = [
    ["common"],          # errors, values, cluster specs, log, environment, addresses, checksums
    ["metrics"],         # the registry, the HTTP endpoint, the library's own counters, summaries
    ["data"],            # datasets and their file formats
    ["wire"],            # frames, statuses, connections, values on the wire
    ["net"],             # reaching peers: handshake, security, reconnecting peers
    ["client"],          # what calls a ps: sharded reads and writes, sparse lookups
    ["ps", "worker"],    # the two services a task serves
    ["chief"],           # the coordinator
    ["checkpoint"],      # saving and restoring what the chief placed
    ["server"],          # a ps or worker task: sessions, accepting, shutdown
]
# Generated protobuf headers: compiled from src/proto, below every layer.
GENERATED = {"pscoro.pb.h", "example.pb.h", "summary.pb.h"}
NOT_CODE = {"proto", "package"}  # folders of src/ that hold no C++

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    layer_of = {folder: i for i, row in enumerate(LAYERS) for folder in row}
    problems, checked = [], 0
    src = root / "src"
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".cpp", ".hpp") or not path.is_file():
            continue
        rel = path.relative_to(root)
        parts = path.relative_to(src).parts
        if len(parts) < 2:
            problems.append(f"{rel}: lies directly in src/; every source belongs to a folder of LAYERS")
            continue
        folder = parts[0]
        if folder not in layer_of:
            problems.append(f"{rel}: src/{folder}/ is not in LAYERS (tests/source/layers.py): place it")
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            checked += 1
            if target in GENERATED:
                continue
            other = target.split("/")[0] if "/" in target else None
            if other is None:
                problems.append(f"{rel}:{number}: includes \"{target}\" without its folder (write \"FOLDER/{target}\")")
            elif other not in layer_of:
                problems.append(f"{rel}:{number}: includes \"{target}\", whose folder src/{other}/ is not in LAYERS")
            elif layer_of[other] > layer_of[folder]:
                problems.append(f"{rel}:{number}: includes \"{target}\", which is above it ({other} is layer "
                                f"{layer_of[other]}, {folder} layer {layer_of[folder]})")
            elif layer_of[other] == layer_of[folder] and other != folder:
                problems.append(f"{rel}:{number}: includes \"{target}\", which is beside it ({other} and {folder} "
                                "are siblings: move what both need down a layer)")
    for path in sorted((root / "include").rglob("*")):
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if m:
                checked += 1
                problems.append(f"{path.relative_to(root)}:{number}: a public header includes \"{m.group(1)}\" "
                                "(public headers include only <pscoro/...> and their dependencies)")
    for folder in layer_of:
        if not (src / folder).is_dir():
            problems.append(f"LAYERS names src/{folder}/, which does not exist")
    for child in sorted(src.iterdir()):
        if child.is_dir() and child.name not in layer_of and child.name not in NOT_CODE:
            problems.append(f"src/{child.name}/ is in no layer (tests/source/layers.py, LAYERS)")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) break the layering")
        print("0 passed, 1 failed")  # scripts/count_tests.py counts this line
        return 1
    print(f"layering holds: {checked} includes in {len(LAYERS)} layers")
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
