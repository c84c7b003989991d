#!/usr/bin/python3
"""Every message, enum, enum value, field and oneof of src/proto/pscoro.proto is named in
docs/protocol.md, the specification of the wire protocol.

Usage: protocol_coverage.py PSCORO_PROTO PROTOCOL_MD. Prints each name the document lacks as
`src/proto/pscoro.proto:LINE: message Foo field bar is not documented in docs/protocol.md` (paths
relative to the folder both files are in) and exits 1; otherwise prints how many names it checked
and exits 0. Ends with the line "N passed, N failed" that scripts/count_tests.py counts. Standard
library only: the .proto is parsed here, not by protobuf (comments, strings, nested messages and
enums, oneof, map<K, V>, options, reserved and extensions lines, services and extend blocks, which
are skipped).

What counts as named. The sections of protocol.md follow the protocol's stages (frames, handshake,
requests), not the messages: one message is described in several sections and one section
describes many messages, so a name is not looked for in "its" section. Nor is a bare word enough:
fields are called `id`, `name`, `begin`, `a`, words any prose holds. Instead the document is cut
into blocks (a paragraph, a list item, a table row together with its table's header row, a fenced
code block, a heading), and
- a top-level message or enum is named when its name is a word inside code (`Hello`, a fenced
  block) anywhere;
- a field or oneof of message M, or a message or enum nested in M, is named when it is a word inside
  code in a block that also names M as a word (in code or not): `Hello.session`,
  `CreateVariable{variable, initializer}`, or "a `Status`: `code` is ...";
- an enum value of enum E is named when it is a word inside code in a block that names E or, for an
  enum nested in a message, that message: "An `Initializer` names its kind (`ZEROS`, ...)".
Words are identifiers: `task_index` is not found inside `to_task_index`; names are case-sensitive.
"""
import os
import re
import sys

SKIPPED_STATEMENTS = {"syntax", "edition", "package", "import", "option", "reserved", "extensions"}
LABELS = {"repeated", "optional", "required"}
WORD = re.compile(r"\d(?:[0-9A-Za-z_.]|(?<=[eE])[+-])*|[A-Za-z0-9_.]+")  # 1e-3, 0x1F, .pkg.Msg, name


class ProtoError(Exception):
    pass


def tokenize(text):
    """(token, line) pairs; comments dropped, strings kept whole."""
    tokens, i, line, n = [], 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ProtoError(f"{line}: unterminated /* comment")
            line += text.count("\n", i, end)
            i = end + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                if j < n and text[j] == "\n":
                    raise ProtoError(f"{line}: unterminated string")
                j += 1
            tokens.append((text[i:j + 1], line))
            i = j + 1
        elif c.isalnum() or c in "_.":
            # A name, a full type name (.pkg.Msg) or a number (1e-3, 0x1F).
            m = WORD.match(text, i)
            tokens.append((m.group(0), line))
            i = m.end()
        else:
            tokens.append((c, line))
            i += 1
    return tokens


class Parser:
    """Collects (line, kind, name, owner) for everything the document must name. owner is the
    message or enum path it belongs to ("" at the top), e.g. ("Initializer", "Kind")."""

    def __init__(self, tokens):
        self.tokens, self.pos = tokens, 0
        self.names = []

    def peek(self, ahead=0):
        i = self.pos + ahead
        return self.tokens[i][0] if i < len(self.tokens) else None

    def line(self):
        return self.tokens[min(self.pos, len(self.tokens) - 1)][1] if self.tokens else 0

    def take(self, expected=None):
        if self.pos >= len(self.tokens):
            raise ProtoError(f"end of file: expected {expected or 'more'}")
        token, line = self.tokens[self.pos]
        if expected is not None and token != expected:
            raise ProtoError(f"{line}: expected '{expected}', found '{token}'")
        self.pos += 1
        return token, line

    def identifier(self):
        token, line = self.take()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            raise ProtoError(f"{line}: expected a name, found '{token}'")
        return token, line

    def skip_statement(self):
        """Up to and including the ';' that ends the statement, over balanced brackets
        (option values may be { aggregates })."""
        depth = 0
        while True:
            token, _ = self.take()
            if token in "{[(" and len(token) == 1:
                depth += 1
            elif token in "}])" and len(token) == 1:
                depth -= 1
            elif token == ";" and depth == 0:
                return

    def skip_block(self):
        """From the next '{' to its matching '}'."""
        while self.peek() != "{":
            self.take()
        depth = 0
        while True:
            token, _ = self.take()
            if token == "{":
                depth += 1
            elif token == "}":
                depth -= 1
                if depth == 0:
                    return

    def field_tail(self, owner, name, line, kind="field"):
        """After the field name: '= NUMBER [options] ;'."""
        self.take("=")
        if self.peek() in ("-", "+"):
            self.take()
        self.take()
        if self.peek() == "[":
            depth = 0
            while True:
                token, _ = self.take()
                depth += token == "["
                depth -= token == "]"
                if depth == 0:
                    break
        if self.peek() == "{":  # a proto2 group: a nested message and a field
            raise ProtoError(f"{line}: groups are not supported")
        self.take(";")
        self.names.append((line, kind, name, owner))

    def file(self):
        while self.pos < len(self.tokens):
            self.statement(())

    def statement(self, owner, in_oneof=False):
        token = self.peek()
        if token == ";":
            self.take()
        elif token in SKIPPED_STATEMENTS:
            self.skip_statement()
        elif token in ("service", "extend"):
            self.skip_block()
        elif token == "message" and not in_oneof:
            self.take()
            name, line = self.identifier()
            self.names.append((line, "message", name, owner))
            self.body(owner + (name,))
        elif token == "enum" and not in_oneof:
            self.take()
            name, line = self.identifier()
            self.names.append((line, "enum", name, owner))
            self.enum_body(owner + (name,))
        elif token == "oneof" and owner and not in_oneof:
            self.take()
            name, line = self.identifier()
            self.names.append((line, "oneof", name, owner))
            self.take("{")
            while self.peek() != "}":
                self.statement(owner, in_oneof=True)
            self.take("}")
        elif not owner:
            raise ProtoError(f"{self.line()}: unexpected '{token}' outside a message")
        elif token == "map" and self.peek(1) == "<":
            self.take()
            self.take("<")
            while self.peek() != ">":
                self.take()
            self.take(">")
            name, line = self.identifier()
            self.field_tail(owner, name, line)
        else:
            if token in LABELS:
                self.take()
            self.take()  # the type
            name, line = self.identifier()
            self.field_tail(owner, name, line)

    def body(self, owner):
        self.take("{")
        while self.peek() != "}":
            if self.peek() is None:
                raise ProtoError(f"end of file inside message {'.'.join(owner)}")
            self.statement(owner)
        self.take("}")

    def enum_body(self, owner):
        self.take("{")
        while self.peek() != "}":
            token = self.peek()
            if token is None:
                raise ProtoError(f"end of file inside enum {'.'.join(owner)}")
            if token == ";":
                self.take()
            elif token in ("option", "reserved"):
                self.skip_statement()
            else:
                name, line = self.identifier()
                self.field_tail(owner, name, line, kind="value")
        self.take("}")


FENCE = re.compile(r"^\s*(```|~~~)")
ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def blocks(markdown):
    """[(all text, code text)] per paragraph, list item, table row, heading or fenced block. A table
    row's text includes its table's header row, which says what the rows describe."""
    out, prose, fenced, fence = [], [], [], None
    table_header = None

    def flush(context=""):
        if prose:
            text = "\n".join(prose)
            out.append((context + "\n" + text, " ".join(m.group(2) for m in CODE_SPAN.finditer(text))))
            prose.clear()

    for line in markdown.splitlines():
        if fence is not None:
            if line.strip().startswith(fence):
                out.append(("\n".join(fenced), "\n".join(fenced)))
                fenced.clear()
                fence = None
            else:
                fenced.append(line)
            continue
        m = FENCE.match(line)
        if m:
            flush()
            fence = m.group(1)
        elif not line.strip():
            flush()
            table_header = None
        elif line.lstrip().startswith("|"):
            flush()
            prose.append(line)
            flush(table_header or "")
            if table_header is None:
                table_header = line
        elif line.lstrip().startswith("#"):
            flush()
            prose.append(line)
            flush()
            table_header = None
        else:
            table_header = None
            if ITEM.match(line):
                flush()
            prose.append(line)
    flush()
    if fence is not None:
        out.append(("\n".join(fenced), "\n".join(fenced)))
    return out


def has_word(text, word):
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text) is not None


def documented(kind, name, owner, doc_blocks):
    if not owner:
        return any(has_word(code, name) for _, code in doc_blocks)
    # Who the block must name: the owning message or enum, or for a nested enum's value the message
    # that holds the enum.
    owners = [owner[-1]]
    if kind == "value" and len(owner) > 1:
        owners.append(owner[-2])
    return any(has_word(code, name) and any(has_word(text, o) for o in owners) for text, code in doc_blocks)


def shown_paths(*paths):
    """The paths relative to the folder both are in (the source tree), else as given."""
    absolute = [os.path.abspath(p) for p in paths]
    root = os.path.commonpath(absolute)
    if root == os.path.dirname(root):  # only the file system root in common
        return list(paths)
    return [os.path.relpath(p, root) for p in absolute]


def main():
    if len(sys.argv) != 3:
        print("usage: protocol_coverage.py PSCORO_PROTO PROTOCOL_MD", file=sys.stderr)
        return 2
    proto_path, doc_path = sys.argv[1], sys.argv[2]
    proto_shown, doc_shown = shown_paths(proto_path, doc_path)
    with open(proto_path, encoding="utf-8") as f:
        proto = f.read()
    with open(doc_path, encoding="utf-8") as f:
        doc_blocks = blocks(f.read())
    parser = Parser(tokenize(proto))
    try:
        parser.file()
    except ProtoError as e:
        print(f"{proto_shown}:{e}: cannot parse (tests/source/protocol_coverage.py)")
        print("0 passed, 1 failed")
        return 1
    if not any(kind == "message" for _, kind, _, _ in parser.names):
        print(f"{proto_shown}: no message found: the parser is broken or the file is empty")
        print("0 passed, 1 failed")
        return 1

    missing = []
    for line, kind, name, owner in parser.names:
        if documented(kind, name, owner, doc_blocks):
            continue
        parents = " ".join(f"{'enum' if kind == 'value' and i == len(owner) - 1 else 'message'} {o}"
                           for i, o in enumerate(owner))
        what = f"{parents} {kind} {name}" if owner else f"{kind} {name}"
        missing.append(f"{proto_shown}:{line}: {what} is not documented in {doc_shown}")
    for m in missing:
        print(m)
    counts = {}
    for _, kind, _, _ in parser.names:
        counts[kind] = counts.get(kind, 0) + 1
    summary = ", ".join(f"{counts.get(k, 0)} {k}s" for k in ("message", "enum", "value", "field", "oneof"))
    if missing:
        print(f"{len(missing)} of {len(parser.names)} names of {proto_shown} are not in {doc_shown} "
              "(a field must be a word in `code` in a paragraph, list item or table row that names its message)")
        print("0 passed, 1 failed")  # scripts/count_tests.py counts this line
        return 1
    summary = summary.replace("values", "enum values")
    print(f"{doc_shown} names all {len(parser.names)} names of {proto_shown} ({summary})")
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
