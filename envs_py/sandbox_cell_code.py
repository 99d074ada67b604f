"""A cell's code before and after it runs (imported by ``sandbox_child.py``; standard library only): the syntax and
await checks that turn a bad cell into a clear error before it runs, and the traceback text of one that raised.
"""

import ast

GATHERERS = {"gather", "wait", "wait_for", "create_task", "as_completed", "ensure_future", "shield"}


def precheck(code, n, forbidden, async_tools):
    """Returns (compiled code or None, error text, whether the last expression is displayed) for cell ``n``:
    ``forbidden`` names (``module.attr``) refuse the cell, and calls of ``async_tools`` must be awaited."""
    if not code.strip():
        return None, "No code available to execute.", False
    try:
        tree = ast.parse(code, f"<cell-{n}>", "exec")
    except (SyntaxError, ValueError) as e:
        line = (e.text or "").rstrip("\n") if isinstance(e, SyntaxError) else ""
        msg = e.msg if isinstance(e, SyntaxError) else str(e)
        return None, f"Execution failed. Traceback:\nSyntax error in line:\n{line}\nMessage: {msg}", False
    ok_calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
            ok_calls.add(id(node.value))
        if isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if fname in GATHERERS:
                for sub in node.args + [k.value for k in node.keywords]:
                    ok_calls.update(id(x) for x in ast.walk(sub) if isinstance(x, ast.Call))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                f"{node.value.id}.{node.attr}" in forbidden:
            return None, f"ERROR: {node.value.id}.{node.attr}() is not allowed in the sandbox.", False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in async_tools \
                and id(node) not in ok_calls:
            name = node.func.id
            return None, (f"ERROR: {name}() requires 'await' to run. Use: result = await {name}(...) or "
                          f"results = await asyncio.gather({name}(...), {name}(...))"), False
    show = bool(tree.body) and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";")
    if show:
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name("__cell_value__", ast.Store())], value=last.value), last)
        ast.fix_missing_locations(tree)
    return compile(tree, f"<cell-{n}>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), "", show


def format_exception(exc, n, code_lines):
    """Returns the traceback text of a cell's exception: only the cells' own frames, long ones elided."""
    lines = ["Traceback (most recent call last):"]
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if fname.startswith("<cell-"):
            frames.append((fname, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    if len(frames) > 8:
        frames = frames[:3] + [None] + frames[-4:]
    for fr in frames:
        if fr is None:
            lines.append("  ... (repeated frames omitted) ...")
            continue
        fname, lineno, func = fr
        where = f"Cell In[{fname[6:-1]}], line {lineno}" + ("" if func == "<module>" else f", in {func}")
        lines.append("  " + where)
        if fname == f"<cell-{n}>" and 0 < lineno <= len(code_lines):
            lines.append("    " + code_lines[lineno - 1].strip())
    msg = str(exc)
    lines.append(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__)
    return "\n".join(lines) + "\n"
