"""The ctypes layer (python/tide/_lib.py) against include/tide.h, without
torch: every prototype the binding declares (restype and argtypes) against
the header's declaration, every enum constant it mirrors against the
header's value, and how libtide is loaded (RTLD_LOCAL unless
TIDE_BACKEND=mpi, so libtide's OpenBLAS stays out of torch's process).
test_abi.py checks the structs' layouts; this file the functions and enums.

Usage: test_lib.py [TIDE_H] (default: $TIDE_SOURCE_DIR/include/tide.h)."""
import ctypes
import os
import re
import subprocess
import sys

P = ctypes.POINTER

SCALARS = {"int": ctypes.c_int, "unsigned": ctypes.c_uint, "size_t": ctypes.c_size_t, "double": ctypes.c_double,
           "float": ctypes.c_float, "long": ctypes.c_long, "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64,
           "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "uint16_t": ctypes.c_uint16,
           "uint8_t": ctypes.c_uint8, "char": ctypes.c_char}


def strip_comments(text):
    """The header without comments, preprocessor lines and C++'s extern "C"."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"#\s*ifdef\s+__cplusplus\b.*?#\s*endif", " ", text, flags=re.S)
    return "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))


def parse_enums(text):
    """{enum type name: {constant: value}} of every `typedef enum {...} NAME;`."""
    enums = {}
    for body, name in re.findall(r"typedef\s+enum\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        values, nxt = {}, 0
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                key, expr = (s.strip() for s in item.split("=", 1))
                nxt = int(eval(expr, {"__builtins__": {}}, dict(values)))  # literals and earlier names
            else:
                key = item
            values[key] = nxt
            nxt += 1
        enums[name] = values
    return enums


def parse_functions(text):
    """{name: (return type, [argument types])} of the tide_* declarations,
    each type as (base, stars) with const and parameter names removed.
    Struct, union and enum bodies are dropped first; declarations taking
    function pointers are left out (the binding declares none)."""
    while True:
        flat = re.sub(r"\{[^{}]*\}", " ", text)
        if flat == text:
            break
        text = flat
    funcs = {}
    for stmt in text.split(";"):
        stmt = " ".join(stmt.split())
        m = re.fullmatch(r"(?:extern )?([\w\s\*]+?)\s*\b(tide_\w+)\s*\(([^()]*)\)", stmt)
        if not m:
            continue
        ret, name, args = m.groups()
        params = [] if args.strip() in ("", "void") else [c_type(a, True) for a in args.split(",")]
        funcs[name] = (c_type(ret, False), params)
    return funcs


def c_type(decl, named):
    tokens = [t for t in re.findall(r"\w+|\*|\[\]", decl) if t not in ("const", "restrict", "struct", "volatile")]
    stars = sum(1 for t in tokens if t in ("*", "[]"))
    words = [t for t in tokens if t not in ("*", "[]")]
    if named and len(words) > 1:
        words = words[:-1]  # the parameter's name
    if words[:1] == ["unsigned"] and len(words) > 1:
        words = words[1:] if words[1] != "int" else ["unsigned"]
    return " ".join(words), stars


def allowed(ctype, enums, structs, is_return):
    """The ctypes types that may stand for the C type (base, stars)."""
    base, stars = ctype
    scalar = ctypes.c_int if base in enums else SCALARS.get(base)
    if stars == 0:
        if base == "void":
            return [None] if is_return else []
        return [scalar] if scalar is not None else []
    if stars == 1:
        if base == "char":
            return [ctypes.c_char_p, ctypes.c_void_p]
        if base == "void":
            return [ctypes.c_void_p]
        if base in structs:
            return [P(structs[base]), ctypes.c_void_p]
        if scalar is not None:
            return [P(scalar), ctypes.c_void_p]
        return [ctypes.c_void_p]  # an opaque handle (tide_comm_t *, tide_request_t *)
    if stars == 2:
        return [P(ctypes.c_char_p), ctypes.c_void_p] if base == "char" else [P(ctypes.c_void_p), ctypes.c_void_p]
    return [ctypes.c_void_p]


def show(t):
    return "None" if t is None else getattr(t, "__name__", repr(t))


def check_protos(protos, funcs, enums, structs):
    """The mismatches, one line each: a name the header does not declare, a
    different number of arguments, a return or argument type ctypes would
    pass differently."""
    bad = []
    for name, (res, args) in sorted(protos.items()):
        if name not in funcs:
            bad.append("%s: the binding declares it; include/tide.h does not" % name)
            continue
        cret, cargs = funcs[name]
        ok = allowed(cret, enums, structs, True)
        if res not in ok:
            bad.append("%s: returns %s%s in tide.h; the binding's restype is %s (want %s)" %
                       (name, cret[0], " " + "*" * cret[1] if cret[1] else "", show(res),
                        " or ".join(show(t) for t in ok)))
        if len(args) != len(cargs):
            bad.append("%s: takes %d arguments in tide.h; the binding's argtypes has %d" %
                       (name, len(cargs), len(args)))
            continue
        for i, (a, c) in enumerate(zip(args, cargs)):
            ok = allowed(c, enums, structs, False)
            if a not in ok:
                bad.append("%s: argument %d is %s%s in tide.h; the binding's argtype is %s (want %s)" %
                           (name, i + 1, c[0], " " + "*" * c[1] if c[1] else "", show(a),
                            " or ".join(show(t) for t in ok)))
    return bad


def check_enums(module, enums):
    """Each int constant of the binding named after a header constant
    (F32 for TIDE_F32) has its value, and an enum the binding mirrors at all
    it mirrors whole (the *_COUNT sentinels aside)."""
    bad, mirrored = [], 0
    for enum, values in sorted(enums.items()):
        mine = {k: getattr(module, k[len("TIDE_"):]) for k in values
                if isinstance(getattr(module, k[len("TIDE_"):], None), int)}
        if not mine:
            continue
        for k, v in sorted(values.items()):
            if k.endswith("_COUNT"):
                continue
            if k not in mine:
                bad.append("%s: tide.h has %s = %d; the binding mirrors the enum but not this value" % (enum, k, v))
            elif mine[k] != v:
                bad.append("%s: %s is %d in tide.h, %s = %d in the binding" % (enum, k, v, k[len("TIDE_"):], mine[k]))
            else:
                mirrored += 1
    return bad, mirrored


def symbol_visible(env, code):
    """Runs code in a fresh python3 with env; True when it prints 'yes'."""
    e = dict(os.environ)
    e.pop("TIDE_BACKEND", None)
    e.update(env)
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=e)
    if out.returncode != 0:
        raise RuntimeError("python3 -c failed: %s" % out.stdout)
    return out.stdout.strip().endswith("yes")


LOOKUP = ("import ctypes\n"
          "def visible():\n"
          "    g = ctypes.CDLL(None)\n"
          "    return all(hasattr(g, s) for s in ('tide_comm_init', 'openblas_get_num_threads'))\n")


def check_loading():
    """libtide and its OpenBLAS are not global after `import tide` unless
    TIDE_BACKEND=mpi (at import, or before tide.torch.init)."""
    bad = []
    if not symbol_visible({}, LOOKUP + "import tide._lib\nprint('yes' if not hasattr(ctypes.CDLL(None), "
                          "'tide_comm_init') else 'no')"):
        bad.append("without TIDE_BACKEND=mpi, import tide made libtide's symbols global (RTLD_GLOBAL)")
    blas = symbol_visible({}, "import ctypes, tide._lib\nprint('yes' if hasattr(ctypes.CDLL(None), "
                          "'openblas_get_num_threads') else 'no')")
    if blas:
        bad.append("without TIDE_BACKEND=mpi, import tide made OpenBLAS's symbols global")
    if not symbol_visible({"TIDE_BACKEND": "mpi"}, LOOKUP + "import tide._lib\nprint('yes' if visible() else 'no')"):
        bad.append("TIDE_BACKEND=mpi at import: libtide and its dependencies are not global (MPI's plugins "
                   "need libmpi's symbols)")
    if not symbol_visible({}, LOOKUP + "import os, tide._lib\nos.environ['TIDE_BACKEND'] = 'MPI'\n"
                          "getattr(tide._lib, 'load_global_for_mpi', lambda: None)()\n"
                          "print('yes' if visible() else 'no')"):
        bad.append("TIDE_BACKEND=mpi set after import: load_global_for_mpi did not make libtide global")
    return bad


def main():
    header = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("TIDE_SOURCE_DIR", "."),
                                                                  "include", "tide.h")
    try:
        from tide import _lib
    except ImportError as e:
        print("FAIL: %s" % e)
        return 1
    with open(header) as f:
        text = strip_comments(f.read())
    enums = parse_enums(text)
    funcs = parse_functions(text)
    if len(funcs) < 100 or "tide_allreduce" not in funcs or "tide_dtype_t" not in enums:
        print("FAIL: parsed only %d functions and %d enums from %s: the parser no longer reads tide.h" %
              (len(funcs), len(enums), header))
        return 1
    bad = check_protos(_lib._PROTOS, funcs, enums, _lib.STRUCTS)
    # The checker itself must see a wrong prototype: a size_t passed as int,
    # a missing argument, a float return read as double, an unknown name.
    wrong = {"tide_allreduce": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                               ctypes.c_int, ctypes.c_int]),
             "tide_wait": (ctypes.c_int, []),
             "tide_adascale_gain": (ctypes.c_float, [ctypes.c_double] * 3),
             "tide_no_such_call": (ctypes.c_int, [])}
    caught = check_protos(wrong, funcs, enums, _lib.STRUCTS)
    if len(caught) != 4:
        bad.append("the checker found %d of 4 planted wrong prototypes: %s" % (len(caught), caught))
    ebad, mirrored = check_enums(_lib, enums)
    bad += ebad
    fake = type("fake", (), {"F32": 0, "F64": 2})
    if len(check_enums(fake, enums)[0]) < 2:
        bad.append("the checker missed a planted wrong enum value (F64 = 2) or missing ones")
    bad += check_loading()
    for line in bad:
        print("FAIL: " + line)
    print("test_lib: %d prototypes and %d enum values against %d declarations of tide.h, loading checked: "
          "%d wrong" % (len(_lib._PROTOS), mirrored, len(funcs), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
