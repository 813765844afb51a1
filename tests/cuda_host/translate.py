#!/usr/bin/env python3
"""Rewrites a file of kernels/cuda/ into C++ a host compiler takes, for the
emulated device of tests/cuda_host (include/cuda_host.hpp says what it runs).

    translate.py SOURCE OUTPUT [TRANSLATED_HEADER ...]   (the headers' source paths)

Only what plain C++ cannot say changes; every kernel body stays as written:
  - kernel<<<grid, block, shared, stream>>>(args);  becomes
    cuda_host::launch((const void *)&kernel, [&] { kernel(args); }, grid, block, shared, stream);
    (the key nullptr for a __global__ template launched without template arguments)
  - extern __shared__ T name[];  becomes  T *name = (T *)cuda_host::dynamic_shared();
    (a plain __shared__ variable is a static: the emulator runs one block at a time)
  - extern "C" on a function goes: everything after the file's includes is put in
    namespace pt_emulated, so that no symbol of the emulation (kernels, entry points,
    the context) can meet the real backend's in a build that has both;
  - #include "kernels/cuda/X" of a header also translated (named after OUTPUT) becomes
    #include "X", the translated copy beside OUTPUT.
#line directives keep compiler messages and sanitizer reports on the source's lines.
"""
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9:]*$")


def fail(source, message):
    sys.exit(f"translate.py: {source}: {message}")


def balanced_end(text, start, open_char, close_char):
    """Index just past the bracket closing the one at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def callee_start(text, end):
    """Start of the kernel expression ending at text[end] (exclusive): a name,
    possibly qualified, possibly with template arguments."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if text[i - 1] == ">":  # template arguments: walk back to their '<'
        depth = 0
        while i > 0:
            i -= 1
            if text[i] == ">":
                depth += 1
            elif text[i] == "<":
                depth -= 1
                if depth == 0:
                    break
        while i > 0 and text[i - 1].isspace():
            i -= 1
    while i > 0 and re.match(r"[A-Za-z_0-9:]", text[i - 1]):
        i -= 1
    return i


GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def deduced_templates(texts):
    """Names of the __global__ templates in texts: launched without template arguments, they
    have no address to key their launch by (their arguments choose the instance)."""
    names = set()
    for text in texts:
        for m in GLOBAL.finditer(text):
            before = text[:m.start()]
            since = max(before.rfind(";"), before.rfind("}"))
            if "template" in before[since + 1:]:
                names.add(m.group(1))
    return names


def comment_spans(text):
    """[start, end) of every comment in text."""
    return [(m.start(), m.end()) for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S)]


def rewrite_launches(text, source, templates):
    out, pos, comments = [], 0, comment_spans(text)
    while True:
        at = text.find("<<<", pos)
        if at < 0:
            out.append(text[pos:])
            return "".join(out)
        if any(a <= at < b for a, b in comments):
            out.append(text[pos:at + 3])
            pos = at + 3
            continue
        start = callee_start(text, at)
        callee = text[start:at].strip()
        name = re.sub(r"<.*", "", callee, flags=re.S).strip()
        if not IDENT.match(name):
            fail(source, f"a launch whose kernel is not a name: '{callee}'")
        close = text.find(">>>", at)
        if close < 0:
            fail(source, "'<<<' without '>>>'")
        config = text[at + 3:close]
        paren = close + 3
        while text[paren].isspace():
            paren += 1
        if text[paren] != "(":
            fail(source, f"launch of {name}: no argument list after '>>>'")
        args_end = balanced_end(text, paren, "(", ")")
        if args_end < 0:
            fail(source, f"launch of {name}: unbalanced arguments")
        args = text[paren + 1:args_end - 1]
        out.append(text[pos:start])
        key = "nullptr" if name in templates and "<" not in callee else f"(const void *)&{callee}"
        out.append(f"cuda_host::launch({key}, [&] {{ {callee}({args}); }}, "
                   f"{config.strip()})")
        pos = args_end


DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+"
    r"(?:__align__\s*\(\s*\d+\s*\)\s+)?(\w+)\s*\[\s*\]\s*;")
EXTERN_C_FUNCTION = re.compile(r'extern\s+"C"\s+(?!\{)')


def namespace_point(lines, source):
    """Index of the line after the file's last #include (and the '}' closing an
    extern "C" block of includes); no code may come before it."""
    last = -1
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#include"):
            last = i
    point = last + 1
    if point < len(lines) and lines[point].strip() == "}":
        point += 1
    in_comment = False
    for line in lines[:point]:
        s = line.strip()
        if in_comment:
            in_comment = "*/" not in s
            continue
        if s.startswith("/*"):
            in_comment = "*/" not in s
            continue
        if not s or s.startswith("#") or s.startswith("//") or s in ('extern "C" {', "}"):
            continue
        fail(source, f"code before the last #include: '{s}'")
    return point


def translate(source, text, headers):
    translated_headers = [os.path.basename(h) for h in headers]
    templates = deduced_templates([text] + [open(h, encoding="utf-8").read() for h in headers])
    text = DYNAMIC_SHARED.sub(r"\1 *\2 = (\1 *)cuda_host::dynamic_shared();", text)
    text = rewrite_launches(text, source, templates)
    text = EXTERN_C_FUNCTION.sub("", text)
    for header in translated_headers:
        text = text.replace(f'#include "kernels/cuda/{header}"', f'#include "{header}"')
    lines = text.split("\n")
    point = namespace_point(lines, source)
    end = len(lines)
    if any(l.startswith("#ifndef PT_") for l in lines[:point]):
        # an include guard: close the namespace before its #endif
        end = max(i for i, l in enumerate(lines) if l.strip().startswith("#endif"))
    name = os.path.relpath(source, os.environ.get("PT_SOURCE_ROOT", os.getcwd()))
    return "\n".join([f'#line 1 "{name}"'] + lines[:point] +
                     ["namespace pt_emulated {", f'#line {point + 1} "{name}"'] +
                     lines[point:end] + ["} // namespace pt_emulated"] + lines[end:]) + "\n"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source, output, headers = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    result = translate(source, text, headers)
    with open(output + ".tmp", "w", encoding="utf-8") as f:
        f.write(result)
    os.replace(output + ".tmp", output)


if __name__ == "__main__":
    main()
