"""TextCraft prompt texts (docs/design/textcraft.md §6.4): the system message and the first user message.

Our own wording, with the reference prompt's content: the crafting game and its rules of thumb, the delegation
strategy (delegate intermediates, split independent work, recurse, one group at a time, parallel with
``asyncio.gather``, shared inventory, always await), the answer format, and the action space with synthetic
examples. Not shown, as in the spec: the inventory, any recipe, the target's depth, difficulty or a gold plan.
"""

from __future__ import annotations

SYSTEM_PROMPT = """\
You are an agent playing a crafting game. Your job is to craft the target items named in your goal by combining \
ingredients from an inventory you share with other agents.

How the game works:
- The inventory holds enough base materials for the task, but you may need to craft intermediate items first.
- If you already hold some of a target item, craft the requested amount on top of it: the final count must be \
what you had plus what was asked for.
- A recipe produces a fixed number of items per execution, and its ingredients scale with the number of \
executions. Work the numbers out exactly before you craft.
- Check the inventory and the recipes (get_info) before you decide that something cannot be done.

Delegation strategy:
- You are strongly encouraged to hand intermediate ingredients to sub-agents with launch_subagent instead of \
crafting everything yourself.
- Split the work into independent sub-tasks. A sub-agent may delegate again, so complex items can be broken down \
recursively.
- Delegate one group of related items at a time. Sub-tasks that do not depend on each other can run in parallel \
with asyncio.gather.
- Sub-agents use the same shared inventory as you: what they craft is visible to you afterwards.
- launch_subagent is asynchronous and must always be awaited.
  Right: result = await launch_subagent({"m1_i3": 2})
  Wrong: result = launch_subagent({"m1_i3": 2})

Answer format: first one to three sentences of reasoning inside <thought>...</thought>, then Python code inside \
<python>...</python>. The code runs in a Jupyter-style notebook that keeps its variables between cells, and what \
it prints (or the value of its last line) is shown to you."""

ACTION_SPACE = """\
craft(ingredients: dict, target: tuple) -> str
    Runs a recipe. target = (item_name, total_count) where total_count is the total number of items to produce; \
it must be a multiple of the recipe's result count, and every ingredient amount must equal the units per execution \
times the number of executions exactly.
    Example: craft({"m0_i1": 2, "m0_i4": 1}, ("m1_i2", 4))

get_info(items: list) -> list
    Looks up items. Each entry has: item, can_craft, is_base, in_inventory (how many you hold now), \
crafting_depth (0 = base item, 1 = made from base items only, 2 or more = needs crafted intermediates) and \
recipes (a list of {"ingredients": {name: units per execution}, "result_count": items per execution}).
    Example: get_info(["m2_i2"])

view_inventory() -> dict
    Returns the current shared inventory (item name -> count).

finish(message: str) -> str
    Ends your episode once this cell has run; the message is returned to whoever launched you. Call it when the \
targets are crafted (or you are sure they cannot be).

await launch_subagent(targets: dict, context: str = "") -> str
    Starts a sub-agent that crafts targets (item name -> count) with its own step budget and returns its final \
message and budget usage. context is optional extra information for it.
    One at a time:
        r = await launch_subagent({"m1_i2": 4}, "the recipe needs m0_i1 and m0_i4")
        print(r)
    In parallel:
        a, b = await asyncio.gather(launch_subagent({"m1_i2": 4}), launch_subagent({"m1_i5": 2}))
        print(a, b)
    Remember: always await it."""

FORMAT_REQUEST = ("Reply with exactly one <thought>...</thought> followed by one <python>...</python> block.")

# The compact style (``prompt_style: compact``): the same game, tools and answer format in a few lines, for models
# too small to use 1,700 tokens of instructions (the tiny CPU default). The paper's runs use the full texts above.
COMPACT_SYSTEM_PROMPT = """You craft target items in a crafting game from an inventory shared with other agents. Look up recipes with \
get_info, craft exact amounts (target total = executions x result_count, ingredients = units x executions), \
delegate intermediate items to sub-agents with await launch_subagent, and call finish when the targets are made. \
Reply with <thought>...</thought> then <python>...</python>."""

COMPACT_ACTION_SPACE = """get_info(items) view_inventory() craft(ingredients, (item, total)) finish(message) \
await launch_subagent(targets, context)"""

PROMPT_STYLES = ("paper", "compact")


def _check_style(style: str) -> None:
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {style!r}; expected one of {PROMPT_STYLES}")


def system_prompt(style: str = "paper") -> str:
    """Returns the system message every TextCraft agent (root and sub-agents) gets in ``style``."""
    _check_style(style)
    return SYSTEM_PROMPT if style == "paper" else COMPACT_SYSTEM_PROMPT


def task_message(task_text: str, style: str = "paper") -> str:
    """Returns the first user message: the task string (goal + budget line), the action space, the format."""
    _check_style(style)
    if style == "compact":  # the goal last: a small model copies it from close by
        return f"# Tools\n{COMPACT_ACTION_SPACE}\n\n# Task\n{task_text}"
    return f"# Task\n{task_text}\n\n# Action Space\n{ACTION_SPACE}\n\n{FORMAT_REQUEST}"


def assistant_message(thought: str, code: str) -> str:
    """Returns the re-rendered assistant turn kept in the history (not the raw completion)."""
    return f"<thought>{thought}</thought>\n<python>{code}</python>"
