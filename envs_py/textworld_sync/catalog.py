"""Fixed vocabulary of TextWorld-Sync: rooms, compass aliases, tools, preparations and the ingredient table.

The world keeps CookingWorld's words but none of its physics (docs/design/textworld.md §5, §14). Everything here is constant data
shared by the world rules, the generator and the solver.
"""

from __future__ import annotations

# Ordered room list; a task uses the first max(4, min(11, numLocations)) rooms (docs/design/textworld.md §5.1).
ROOMS: tuple[str, ...] = (
    "kitchen", "pantry", "garden", "supermarket", "hallway", "dining room",
    "garage", "study", "basement", "attic", "courtyard",
)
DEFAULT_NUM_LOCATIONS = 6
# Rooms an ingredient may start in; any other source room maps to the kitchen (docs/design/textworld.md §5.2).
SOURCE_ROOMS = frozenset({"kitchen", "pantry", "garden", "supermarket"})
# Absolute compass aliases, in the order they are offered (docs/design/textworld.md §5.1, §7 item 3).
COMPASS: tuple[tuple[str, str], ...] = (
    ("north", "pantry"), ("south", "dining room"), ("east", "garden"), ("west", "supermarket"),
)

TRIVIAL = frozenset({"raw", "uncut"})
# Cuts in the order they are offered: preparation word -> verb.
CUTS: tuple[tuple[str, str], ...] = (("chopped", "chop"), ("sliced", "slice"), ("diced", "dice"), ("minced", "mince"))
# Cooks in the order they are offered: preparation word -> tool (docs/design/textworld.md §7 item 7).
COOKS: tuple[tuple[str, str], ...] = (
    ("fried", "stove"), ("roasted", "oven"), ("grilled", "grill"), ("baked", "oven"), ("boiled", "stove"),
)
# How a cook action names its tool in the command string.
TOOL_PHRASE = {"stove": "in stove", "oven": "in oven", "grill": "on grill"}
# Tool order for cook commands offered under the `full` rules (one command per tool).
COOK_TOOLS: tuple[str, ...] = ("stove", "oven", "grill")
# What each tool produces by default under the `full` rules (boiled/baked only when the recipe asks for them).
TOOL_DEFAULT = {"stove": "fried", "oven": "roasted", "grill": "grilled"}
TOOL_ALTERNATE = {"stove": "boiled", "oven": "baked"}
CUT_WORDS = frozenset(word for word, _ in CUTS)
COOK_WORDS = frozenset(word for word, _ in COOKS)

PANTRY = ("pantry.shelf", "supermarket.showcase")
FRIDGE_SHOP = ("kitchen.fridge", "supermarket.showcase")
FRIDGE_GARDEN = ("kitchen.fridge", "garden")
COUNTER_GARDEN = ("kitchen.counter", "garden")

# The ingredient table the generator draws from: name -> (candidate source locations, preparation options).
# These are the 22 ingredients and the preparation options observed in the official test records (docs/design/textworld.md §3.3);
# the upstream database itself is not shipped, so this table is our own reconstruction of it.
INGREDIENTS: dict[str, tuple[tuple[str, str], tuple[tuple[str, str], ...]]] = {
    "salt": (PANTRY, (("raw", "uncut"),)),
    "black pepper": (PANTRY, (("raw", "uncut"),)),
    "olive oil": (PANTRY, (("raw", "uncut"),)),
    "flour": (PANTRY, (("raw", "uncut"),)),
    "water": (FRIDGE_SHOP, (("raw", "uncut"),)),
    "chicken leg": (FRIDGE_SHOP, (("roasted", "uncut"),)),
    "chicken wing": (FRIDGE_SHOP, (("fried", "uncut"),)),
    "pork chop": (FRIDGE_SHOP, (("grilled", "chopped"), ("grilled", "sliced"))),
    "block of cheese": (FRIDGE_SHOP, (("fried", "sliced"),)),
    "white onion": (FRIDGE_GARDEN, (("fried", "sliced"), ("grilled", "diced"))),
    "yellow bell pepper": (FRIDGE_GARDEN, (("grilled", "chopped"), ("grilled", "diced"))),
    "orange bell pepper": (FRIDGE_GARDEN, (("grilled", "diced"), ("roasted", "uncut"))),
    "cilantro": (FRIDGE_GARDEN, (("raw", "chopped"),)),
    "parsley": (FRIDGE_GARDEN, (("raw", "chopped"),)),
    "carrot": (FRIDGE_GARDEN, (("fried", "diced"), ("grilled", "diced"), ("raw", "diced"))),
    "red onion": (FRIDGE_GARDEN, (("grilled", "uncut"), ("roasted", "sliced"))),
    "red potato": (COUNTER_GARDEN, (("grilled", "uncut"), ("roasted", "uncut"))),
    "yellow potato": (COUNTER_GARDEN, (("fried", "uncut"), ("roasted", "sliced"))),
    "purple potato": (COUNTER_GARDEN, (("grilled", "sliced"), ("roasted", "chopped"))),
    "banana": (COUNTER_GARDEN, (("fried", "uncut"), ("raw", "chopped"))),
    "red apple": (COUNTER_GARDEN, (("fried", "uncut"), ("grilled", "chopped"), ("roasted", "uncut"))),
    "red hot pepper": (COUNTER_GARDEN, (("fried", "diced"), ("grilled", "uncut"))),
}


def task_rooms(num_locations: int | None) -> tuple[str, ...]:
    """Returns the rooms a task uses: the first max(4, min(11, numLocations)) of ROOMS (6 when unknown)."""
    n = DEFAULT_NUM_LOCATIONS if num_locations is None else int(num_locations)
    return ROOMS[: max(4, min(len(ROOMS), n))]


def start_room(candidate_source_locations) -> str:
    """Returns the room an ingredient starts in: the room part of its first source, kitchen if not a source room."""
    if not candidate_source_locations:
        return "kitchen"
    room = str(candidate_source_locations[0]).split(".", 1)[0]
    return room if room in SOURCE_ROOMS else "kitchen"


def branch_work(preparation) -> int:
    """Returns 1 (take) + 1 if a cut is needed + 1 if a cook is needed, as the generator counts it."""
    prep = set(preparation)
    return 1 + ("uncut" not in prep) + ("raw" not in prep)
