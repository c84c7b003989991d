#!/usr/bin/python3
"""A strict parser of the Prometheus text exposition format 0.0.4, written from the format's
specification (prometheus/docs, content/docs/instrumenting/exposition_formats.md) and independent
of pscoro's code: it refuses what the format does not allow, then evaluates checks on the values.

usage: parse_metrics.py PAGE CHECK...
Each CHECK is a Python expression over v(name, **labels) (the value of one sample; an error when
there is none), has(name, **labels), total(name) (the sum over a name's samples) and samples
(a dict {(name, frozenset(labels.items())): value}). Exits 1 naming the first problem.
"""
import math
import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class Invalid(Exception):
    pass


def parse_value(text, where):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise Invalid(f"{where}: bad value {text!r}")
    return float(text)


def unescape(text, where, quote):
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text):
                raise Invalid(f"{where}: dangling backslash")
            n = text[i + 1]
            if n == "\\":
                out.append("\\")
            elif n == "n":
                out.append("\n")
            elif n == '"' and quote:
                out.append('"')
            else:
                raise Invalid(f"{where}: bad escape \\{n}")
            i += 2
            continue
        if c == "\n" or (quote and c == '"'):
            raise Invalid(f"{where}: unescaped {c!r}")
        out.append(c)
        i += 1
    return "".join(out)


def parse_labels(text, where):
    """text starts after '{'; returns (labels, rest after '}')."""
    labels, i = {}, 0
    while True:
        if text[i:i + 1] == "}":
            return labels, text[i + 1:]
        m = LABEL.match(text, i)
        if not m:
            raise Invalid(f"{where}: bad label name at {text[i:]!r}")
        name = m.group(0)
        i = m.end()
        if text[i:i + 2] != '="':
            raise Invalid(f"{where}: expected =\" after label {name}")
        i += 2
        j = i
        while True:
            if j >= len(text):
                raise Invalid(f"{where}: unterminated label value")
            if text[j] == "\\":
                j += 2
                continue
            if text[j] == '"':
                break
            j += 1
        if name in labels:
            raise Invalid(f"{where}: label {name} twice")
        labels[name] = unescape(text[i:j], where, True)
        i = j + 1
        if text[i:i + 1] == ",":
            i += 1
            if text[i:i + 1] == "}":
                return labels, text[i + 1:]  # a trailing comma is allowed
        elif text[i:i + 1] != "}":
            raise Invalid(f"{where}: expected , or }} after label {name}")


def family_of(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
            return base
    return name


def parse(page):
    if page and not page.endswith("\n"):
        raise Invalid("the page does not end with a line feed")
    types, helps, samples = {}, {}, {}
    done = set()  # families whose samples ended: a family's lines must be together
    current = None
    for number, line in enumerate(page.split("\n")[:-1], 1):
        where = f"line {number}"
        if line == "" or (line.startswith("#") and not re.match(r"#\s*(HELP|TYPE)\s", line)):
            continue
        if line.startswith("#"):
            m = re.fullmatch(r"#\s*(HELP|TYPE)\s+(\S+)(?:\s(.*))?", line)
            if not m or not NAME.fullmatch(m.group(2)):
                raise Invalid(f"{where}: bad comment line {line!r}")
            kind, name, rest = m.group(1), m.group(2), m.group(3) or ""
            if name in done or (current is not None and current != name and name in types):
                raise Invalid(f"{where}: {kind} for {name} after its samples")
            if kind == "HELP":
                if name in helps:
                    raise Invalid(f"{where}: second HELP for {name}")
                helps[name] = unescape(rest, where, False)
            else:
                if name in types:
                    raise Invalid(f"{where}: second TYPE for {name}")
                if rest not in TYPES:
                    raise Invalid(f"{where}: bad type {rest!r}")
                if any(family_of(n, {name: rest}) == name for (n, _) in samples):
                    raise Invalid(f"{where}: TYPE for {name} after its samples")
                types[name] = rest
            if current is not None and current != name:
                done.add(current)
            current = name
            continue
        m = NAME.match(line)
        if not m:
            raise Invalid(f"{where}: bad metric name in {line!r}")
        name, rest = m.group(0), line[m.end():]
        labels = {}
        if rest.startswith("{"):
            labels, rest = parse_labels(rest[1:], where)
        parts = rest.split(" ")
        if len(parts) not in (2, 3) or parts[0] != "":
            raise Invalid(f"{where}: expected one space, a value and maybe a timestamp: {line!r}")
        value = parse_value(parts[1], where)
        if len(parts) == 3 and not re.fullmatch(r"-?\d+", parts[2]):
            raise Invalid(f"{where}: bad timestamp {parts[2]!r}")
        family = family_of(name, types)
        if family in done:
            raise Invalid(f"{where}: a sample of {family} apart from the rest of its family")
        if current is not None and current != family:
            done.add(current)
        current = family
        kind = types.get(family, "untyped")
        if kind == "histogram" and name == family:
            raise Invalid(f"{where}: histogram {family} has a bare sample")
        if "le" in labels and not (kind == "histogram" and name.endswith("_bucket")):
            raise Invalid(f"{where}: le label outside a histogram bucket")
        if kind == "counter" and not (value >= 0):
            raise Invalid(f"{where}: counter {name} is {value}")
        key = (name, frozenset(labels.items()))
        if key in samples:
            raise Invalid(f"{where}: duplicate series {name}{labels}")
        samples[key] = value
    # Histograms: cumulative buckets ending at +Inf, which equals _count; a _sum.
    for family, kind in types.items():
        if kind != "histogram":
            continue
        series = {}
        for (name, labels), value in samples.items():
            if name == family + "_bucket":
                rest = frozenset((k, v) for k, v in labels if k != "le")
                le = dict(labels).get("le")
                if le is None:
                    raise Invalid(f"{family}: a bucket without le")
                series.setdefault(rest, []).append((parse_value(le, family), value))
        for rest, buckets in series.items():
            buckets.sort()
            if buckets[-1][0] != math.inf:
                raise Invalid(f"{family}{dict(rest)}: no +Inf bucket")
            counts = [c for _, c in buckets]
            if counts != sorted(counts):
                raise Invalid(f"{family}{dict(rest)}: buckets not cumulative {counts}")
            if samples.get((family + "_count", rest)) != counts[-1]:
                raise Invalid(f"{family}{dict(rest)}: _count is not the +Inf bucket")
            if (family + "_sum", rest) not in samples:
                raise Invalid(f"{family}{dict(rest)}: no _sum")
    return samples


def main():
    page = open(sys.argv[1], encoding="utf-8").read()
    try:
        samples = parse(page)
    except Invalid as e:
        print(f"{sys.argv[1]}: not valid 0.0.4: {e}")
        return 1

    def v(name, **labels):
        key = (name, frozenset(labels.items()))
        if key not in samples:
            raise KeyError(f"no sample {name}{labels}")
        return samples[key]

    def has(name, **labels):
        return (name, frozenset(labels.items())) in samples

    def total(name):
        return sum(value for (n, _), value in samples.items() if n == name)

    scope = {"v": v, "has": has, "total": total, "samples": samples}
    for check in sys.argv[2:]:
        try:
            ok = eval(check, scope)
        except Exception as e:  # noqa: BLE001 - a check that cannot be evaluated fails, saying why
            print(f"{sys.argv[1]}: {check}: {type(e).__name__}: {e}")
            return 1
        if not ok:
            print(f"{sys.argv[1]}: {check} is false")
            return 1
    print(f"{sys.argv[1]}: {len(samples)} samples, valid 0.0.4, {len(sys.argv) - 2} checks hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
