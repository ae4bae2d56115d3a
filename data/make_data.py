#!/usr/bin/env python
"""Generate the project's shipped data: a small English-like corpus, SFT sets and a byte-level BPE tokenizer.

Everything is produced procedurally by this script from word lists and templates written for this project,
with a fixed seed, so the output is byte-for-byte reproducible:

    python data/make_data.py            # writes data/corpus.jsonl, sft.jsonl, sft_chat.jsonl, tokenizer/, stats.json
    python data/make_data.py --check    # regenerates into a temp dir and compares with the shipped files

Document lengths are drawn from a log-normal distribution (a few tokens to several thousand), so packing and
sequence-parallel sharding see realistic mixes of short and long documents.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

SEED = 20240611
N_CORPUS = 1800
N_SFT = 1500
N_CHAT = 800
VOCAB_SIZE = 3072
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
# ChatML-style template; assistant turns (content + <|im_end|>) are wrapped in {% generation %} so that
# `return_assistant_tokens_mask=True` (TRL's assistant_only_loss) marks exactly what the assistant must produce.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# ----------------------------------------------------------------------------------------------- word lists
NAMES = (
    "Ada Bruno Clara Dmitri Elena Farah Gustav Hana Ivan Jonas Kira Leo Maya Nadia Omar Priya Quentin Rosa Samir "
    "Tara Umar Vera Wendell Xavier Yuki Zora Amir Beatrix Cyrus Delia Emil Fiona Gideon Helga Isla Jasper Kofi "
    "Lena Milo Nell Otto Pia Rafael Selma Tobias Una Viktor Wren Yara Zeke Ingrid Marcus Odile Pavel Ruth Soren"
).split()
SYL_A = "Ash Bell Brack Cal Dun El Fern Glen Hal Ivy Kes Lorn Mar North Oak Pen Quill Rav Sil Thorn Wil Yar".split()
SYL_B = "ford mere wick haven moor dale ton brook field gate holm stead vale crest port fall ridge wood".split()
ANIMALS = (
    "fox heron badger otter lynx owl tortoise sparrow wolf hare beaver moth salmon crow deer goat mole seal "
    "whale falcon lizard bee frog squirrel stork yak camel raven swan toad beetle pelican ferret"
).split()
OBJECTS = (
    "lantern compass kettle map violin bicycle telescope notebook umbrella key clock rope basket mirror hammer "
    "coin letter boat bridge candle drum ladder wagon scarf kite spoon bell chest whistle anchor quilt shovel "
    "teapot pendant flute cart jar helmet saddle"
).split()
ADJS = (
    "old quiet bright tiny enormous curious brave rusty golden hollow gentle stubborn clever ancient fragile "
    "noisy silent crooked shiny dusty heavy light narrow wide strange familiar patient restless careful cheerful "
    "gloomy humble proud wild tame sturdy delicate peculiar ordinary"
).split()
COLORS = "red blue green amber grey violet white black silver crimson ochre teal".split()
MATERIALS = "wood brass glass stone wool copper silver clay iron leather bamboo linen".split()
OBJ_VERBS = (
    "found carried repaired painted lost opened borrowed polished sold hid traded wrapped cleaned measured "
    "dropped guarded returned sketched"
).split()
MOTIONS = "walked ran wandered climbed sailed hurried drifted cycled rode marched strolled travelled".split()
EMOTIONS = "happy nervous proud tired surprised puzzled calm hopeful anxious delighted lonely grateful".split()
TIMES = [
    "In the morning",
    "Later that day",
    "At dusk",
    "The next week",
    "Before sunrise",
    "Years later",
    "On a rainy afternoon",
    "Just after noon",
    "That winter",
    "Early on Sunday",
    "By midnight",
    "Soon after",
]
WEATHER = "rain fog snow wind sunshine thunder drizzle frost hail mist".split()
FOODS = "apples pears loaves eggs carrots plums onions lemons potatoes cookies muffins oranges peaches beans".split()
JOBS = (
    "baker sailor carpenter teacher doctor gardener librarian miner weaver clockmaker potter fisher "
    "painter blacksmith cartographer beekeeper"
).split()
LANDMARKS = [
    "old mill",
    "stone bridge",
    "market square",
    "lighthouse",
    "orchard",
    "village well",
    "chapel",
    "harbor wall",
    "ferry dock",
    "clock tower",
    "bakery",
    "north gate",
    "river bend",
    "hilltop",
]
QUOTES = [
    "We should leave before the {w} gets worse",
    "I have never seen a {a} {o} like this",
    "Do you think the {an} will come back",
    "Every {o} tells a story",
    "Let us count the {f} again",
    "The road to {p} is longer than it looks",
    "Keep the {o} safe until I return",
    "Nothing is ever truly lost",
]
ABILITIES = [
    "sing at night",
    "point north",
    "glow in the dark",
    "predict the {w}",
    "open any door",
    "remember every voice",
    "float on water",
    "keep time perfectly",
]
SEASONS = "spring summer autumn winter".split()
DIRECTIONS = "north south east west north-east south-west".split()
TASKS = [
    "bake bread",
    "plant a garden",
    "build a kite",
    "repair a bicycle",
    "paint a fence",
    "brew tea",
    "pack for a trip",
    "clean a lantern",
    "tune a violin",
    "make soup",
]
STEP_VERBS = [
    "Gather",
    "Check",
    "Clean",
    "Measure",
    "Mix",
    "Attach",
    "Fold",
    "Heat",
    "Wait for",
    "Inspect",
    "Place",
    "Secure",
    "Rinse",
    "Sort",
    "Label",
]


def place(rng: random.Random) -> str:
    return rng.choice(SYL_A) + rng.choice(SYL_B)


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def art(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


# ------------------------------------------------------------------------------------- corpus generators
def story(rng: random.Random) -> Iterator[str]:
    hero, friend, town = rng.choice(NAMES), rng.choice(NAMES), place(rng)
    obj, an = rng.choice(OBJECTS), rng.choice(ANIMALS)
    pron = rng.choice(["She", "He", "They"])
    yield f"The {cap(rng.choice(ADJS))} {cap(obj)}\n\n"
    chapter, sent = 1, 0
    while True:
        sep = " " if sent else ""
        if sent and sent % 40 == 0:
            chapter += 1
            sep = f"\n\nChapter {chapter}: The {cap(rng.choice(ADJS))} {cap(rng.choice(OBJECTS + ANIMALS))}\n\n"
        elif sent and sent % rng.randint(4, 7) == 0:
            sep = "\n\n"
        k = rng.randrange(9)
        w, a, o, f = rng.choice(WEATHER), rng.choice(ADJS), rng.choice(OBJECTS), rng.choice(FOODS)
        if k == 0:
            s = f"{rng.choice(TIMES)}, {hero} {rng.choice(MOTIONS)} to {rng.choice([town, place(rng)])}."
        elif k == 1:
            s = f"{pron} {rng.choice(OBJ_VERBS)} {art(a)} {obj} made of {rng.choice(MATERIALS)}."
        elif k == 2:
            s = f"Near the {rng.choice(LANDMARKS)}, {hero} met {art(rng.choice(ADJS))} {an} that liked {f}."
        elif k == 3:
            q = rng.choice(QUOTES).format(w=w, a=a, o=o, an=an, f=f, p=town)
            s = f'"{q}," said {rng.choice([hero, friend])}.'
        elif k == 4:
            s = f"The {w} made the path to the {rng.choice(LANDMARKS)} {rng.choice(ADJS)} and {rng.choice(ADJS)}."
        elif k == 5:
            s = f"{hero} felt {rng.choice(EMOTIONS)} because the {obj} was {rng.choice(ADJS)}."
        elif k == 6:
            ab = rng.choice(ABILITIES).format(w=w)
            s = f"Nobody in {town} knew that the {obj} could {ab}."
        elif k == 7:
            s = f"{friend}, the {rng.choice(JOBS)}, counted {rng.randint(2, 99)} {f} and shared them with {hero}."
        else:
            s = f"The {rng.choice(COLORS)} {o} on the table belonged to the {rng.choice(JOBS)} from {place(rng)}."
        sent += 1
        yield sep + s


def encyclopedia(rng: random.Random) -> Iterator[str]:
    town, region = place(rng), place(rng)
    yield f"{town}\n\n"
    sections = ["History", "Geography", "Economy", "Culture", "Wildlife", "Transport", "Climate", "Notable people"]
    i = 0
    while True:
        sep = f"\n\n{sections[(i // 6) % len(sections)]}\n\n" if i and i % 6 == 0 else (" " if i else "")
        k = rng.randrange(8)
        if k == 0:
            s = (
                f"{town} is a {rng.choice(['small', 'large', 'quiet', 'busy'])} "
                f"town in the {rng.choice(DIRECTIONS)} of {region}."
            )
        elif k == 1:
            s = f"It had a population of {rng.randint(300, 90000):,} people in {rng.randint(1850, 2020)}."
        elif k == 2:
            s = f"The town is known for its {rng.choice(FOODS)} and its {rng.choice(ADJS)} {rng.choice(LANDMARKS)}."
        elif k == 3:
            s = (
                f"In {rng.choice(SEASONS)} the weather brings {rng.choice(WEATHER)}, "
                f"and temperatures reach {rng.randint(-15, 38)} degrees."
            )
        elif k == 4:
            s = (
                f"The {rng.choice(ANIMALS)} is common in the "
                f"{rng.choice(['forests', 'marshes', 'hills', 'meadows'])} around {town}."
            )
        elif k == 5:
            s = (
                f"{cap(art(rng.choice(MATERIALS)))} {rng.choice(OBJECTS)} "
                f"from {rng.randint(1200, 1900)} is kept in the town museum."
            )
        elif k == 6:
            s = f"{rng.choice(NAMES)} {rng.choice(NAMES)}, a famous {rng.choice(JOBS)}, was born here."
        else:
            nb = rng.randint(1, 9)
            s = (
                f"The road to {place(rng)} is {rng.randint(2, 140)} "
                f"kilometres long and crosses {nb} bridge{'s' * (nb > 1)}."
            )
        i += 1
        yield sep + s


PROBLEM_KINDS = 5


def word_problem(rng: random.Random, kind: int | None = None) -> tuple[str, str]:
    """An arithmetic word problem and a worked, correct solution."""
    kind = rng.randrange(PROBLEM_KINDS) if kind is None else kind
    a_name, b_name, f = rng.choice(NAMES), rng.choice(NAMES), rng.choice(FOODS)
    if kind == 0:
        a, b = rng.randint(2, 60), rng.randint(1, 40)
        c = rng.randint(0, a + b)
        r = a + b - c
        q = (
            f"{a_name} has {a} {f}. {a_name} buys {b} more and gives "
            f"{c} to {b_name}. How many {f} does {a_name} have now?"
        )
        s = (
            f"{a_name} starts with {a}. After buying {b}: {a} + {b} = {a + b}. "
            f"After giving {c} away: {a + b} - {c} = {r}. The answer is {r}."
        )
    elif kind == 1:
        n, m = rng.randint(2, 12), rng.randint(2, 24)
        q = f"A {rng.choice(JOBS)} packs {f} into {n} boxes with {m} in each box. How many {f} are packed?"
        s = f"Each box holds {m}, and there are {n} boxes: {n} x {m} = {n * m}. The answer is {n * m}."
    elif kind == 2:
        k, each = rng.randint(2, 9), rng.randint(2, 15)
        q = f"{a_name} shares {k * each} {f} equally among {k} friends. How many {f} does each friend get?"
        s = f"Divide the {f} by the number of friends: {k * each} / {k} = {each}. The answer is {each}."
    elif kind == 3:
        n, price = rng.randint(2, 20), rng.randint(1, 30)
        paid = n * price + rng.randint(0, 50)
        q = (
            f"{a_name} buys {n} {f} at {price} coins each and pays "
            f"with {paid} coins. How much change does {a_name} get?"
        )
        s = (
            f"The cost is {n} x {price} = {n * price} coins. The change is {paid} "
            f"- {n * price} = {paid - n * price}. The answer is {paid - n * price}."
        )
    else:
        speed, hours = rng.randint(3, 80), rng.randint(1, 9)
        q = (
            f"A {rng.choice(['wagon', 'boat', 'cyclist', 'train'])} travels at "
            f"{speed} kilometres per hour for {hours} hours. How far does it go?"
        )
        s = (
            f"Distance is speed times time: {speed} x {hours} = "
            f"{speed * hours}. The answer is {speed * hours} kilometres."
        )
    return q, s


def problems(rng: random.Random) -> Iterator[str]:
    yield f"Practice problems, set {rng.randint(1, 99)}\n\n"
    i = 1
    while True:
        q, s = word_problem(rng)
        yield f"Problem {i}. {q}\nSolution: {s}\n\n"
        i += 1


def lists(rng: random.Random) -> Iterator[str]:
    kind = rng.randrange(3)
    if kind == 0:
        yield f"Shopping list for {rng.choice(NAMES)}:\n"
        while True:
            yield f"- {rng.randint(1, 12)} {rng.choice(FOODS)} ({rng.choice(ADJS)})\n"
    elif kind == 1:
        yield f"How to {rng.choice(TASKS)}:\n"
        i = 1
        while True:
            yield (
                f"{i}. {rng.choice(STEP_VERBS)} the {rng.choice(ADJS)} "
                f"{rng.choice(OBJECTS)} for {rng.randint(1, 30)} minutes.\n"
            )
            i += 1
    else:
        yield "item,material,count,price\n"
        while True:
            yield (
                f"{rng.choice(OBJECTS)},{rng.choice(MATERIALS)}"
                f",{rng.randint(0, 500)},{rng.randint(1, 9999) / 100:.2f}\n"
            )


def code_function(rng: random.Random) -> str:
    noun, attr, n = rng.choice(OBJECTS), rng.choice(["weight", "price", "age", "size", "count"]), rng.randint(1, 100)
    k = rng.randrange(6)
    if k == 0:
        return (
            f'def select_{noun}s(items, limit={n}):\n    """Return the {noun}s whose {attr} is above limit."""\n'
            f"    result = []\n    for item in items:\n"
            f"        if item.{attr} > limit:\n            result.append(item)\n"
            "    return result\n"
        )
    if k == 1:
        return (
            f"def total_{attr}(items):\n    total = 0\n    for item in items:\n        total += item.{attr}\n"
            "    return total\n"
        )
    if k == 2:
        fields = rng.sample(["name", "color", "material", "weight", "owner", "price"], 3)
        body = "".join(f"        self.{f} = {f}\n" for f in fields)
        return (
            f"class {cap(noun)}:\n    def __init__(self, {', '.join(fields)}):\n{body}\n"
            f'    def describe(self):\n        return f"{{self.{fields[0]}}} ({noun})"\n'
        )
    if k == 3:
        return (
            f"def count_{noun}s(names):\n    counts = {{}}\n    for name in names:\n"
            "        counts[name] = counts.get(name, 0) + 1\n    return counts\n"
        )
    if k == 4:
        return (
            f"def factorial(n):\n    if n <= 1:\n        return 1\n    return "
            f"n * factorial(n - 1)\n\n\nprint(factorial({rng.randint(2, 12)}))\n"
        )
    return (
        f"{noun.upper()}_LIMIT = {n}\n\n\ndef is_{rng.choice(ADJS)}({noun}):\n"
        f'    return {noun}.{attr} < {noun.upper()}_LIMIT and {noun}.name != "{rng.choice(NAMES)}"\n'
    )


def code(rng: random.Random) -> Iterator[str]:
    yield f"# {place(rng).lower()}_{rng.choice(OBJECTS)}.py: helpers for the {rng.choice(JOBS)}'s inventory\n\n"
    while True:
        yield code_function(rng) + "\n\n"


def letter(rng: random.Random) -> Iterator[str]:
    to, frm = rng.choice(NAMES), rng.choice(NAMES)
    yield f"Dear {to},\n\n"
    sents = story(rng)
    next(sents)
    i = 0
    while True:
        i += 1
        if i % 15 == 0:
            yield f"\n\nI will write again soon.\nBest wishes,\n{frm}\n\nP.S."
        yield next(sents)


def dialogue(rng: random.Random) -> Iterator[str]:
    a, b = rng.sample(NAMES, 2)
    while True:
        q, s = (
            word_problem(rng)
            if rng.random() < 0.3
            else (
                f"Have you seen the {rng.choice(ADJS)} {rng.choice(OBJECTS)} near the {rng.choice(LANDMARKS)}?",
                f"Yes, it was there {rng.choice(TIMES).lower()}, next to {art(rng.choice(ANIMALS))}.",
            )
        )
        yield f"{a}: {q}\n{b}: {s}\n"
        a, b = b, a


def recipe(rng: random.Random) -> Iterator[str]:
    yield (
        f"Recipe: {cap(rng.choice(ADJS))} {rng.choice(FOODS)} "
        f"{rng.choice(['soup', 'pie', 'stew', 'salad', 'cake'])}\nIngredients:\n"
    )
    for _ in range(rng.randint(2, 6)):
        yield f"- {rng.randint(1, 500)} g of {rng.choice(FOODS)}\n"
    yield "Steps:\n"
    i = 1
    while True:
        yield (
            f"{i}. {rng.choice(STEP_VERBS)} the {rng.choice(FOODS)} in "
            f"{art(rng.choice(MATERIALS))} bowl for {rng.randint(1, 45)} minutes.\n"
        )
        i += 1


def report(rng: random.Random) -> Iterator[str]:
    while True:
        yield (
            f"Weather report for {place(rng)}: {rng.randint(-20, 40)} degrees, {rng.choice(WEATHER)}, wind from the "
            f"{rng.choice(DIRECTIONS)} at {rng.randint(0, 90)} km/h. "
        )


def short(rng: random.Random) -> str:
    """A document of a few tokens."""
    k = rng.randrange(5)
    if k == 0:
        return f"The {cap(rng.choice(ADJS))} {cap(rng.choice(OBJECTS))}"
    if k == 1:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return f"{a} + {b} = {a + b}"
    if k == 2:
        return f"{cap(art(rng.choice(ADJS)))} {rng.choice(OBJECTS)} keeps no {rng.choice(FOODS)}."
    if k == 3:
        return f"Note from {rng.choice(NAMES)}: buy {rng.choice(FOODS)}."
    return f"{rng.choice(NAMES)} {rng.choice(MOTIONS)} home."


GENERATORS: list[tuple[str, Callable[[random.Random], Iterator[str]], float]] = [
    ("story", story, 0.26),
    ("encyclopedia", encyclopedia, 0.14),
    ("problems", problems, 0.12),
    ("list", lists, 0.1),
    ("code", code, 0.1),
    ("letter", letter, 0.08),
    ("dialogue", dialogue, 0.08),
    ("recipe", recipe, 0.06),
    ("report", report, 0.06),
]


_PIECE = re.compile(r"[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d]")


def grow(gen: Iterator[str], target_tokens: int) -> str:
    """Concatenate chunks from ``gen`` until the text has about ``target_tokens`` tokens.

    Tokens are estimated as words, 3-digit number groups and punctuation marks (close to the trained BPE's count).
    """
    parts, pieces = [], 0
    for chunk in gen:
        parts.append(chunk)
        pieces += len(_PIECE.findall(chunk))
        if pieces >= target_tokens:
            break
    return "".join(parts).strip()


def lognormal_tokens(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(math.exp(rng.gauss(math.log(median), sigma))))))


def make_corpus(rng: random.Random, n: int) -> list[dict]:
    names, gens, weights = zip(*GENERATORS)
    docs = []
    for _ in range(n):
        target = lognormal_tokens(rng, 110, 1.35, 3, 7000)
        if target < 14:
            docs.append({"text": short(rng)})
            continue
        i = rng.choices(range(len(gens)), weights=weights)[0]
        docs.append({"text": grow(gens[i](rng), max(3, target))})
    return docs


# -------------------------------------------------------------------------------------------- SFT tasks
def sft_task(rng: random.Random) -> tuple[str, str]:
    """One instruction and its correct response."""
    k = rng.choices(range(8), weights=[4, 2, 2, 3, 3, 2, 2, 2])[0]
    if k == 0:
        q, s = word_problem(rng)
        return q, s
    if k == 1:
        nums = [rng.randint(-50, 200) for _ in range(rng.randint(3, 12))]
        order = rng.choice(["ascending", "descending"])
        return (
            f"Sort these numbers in {order} order: {', '.join(map(str, nums))}.",
            ", ".join(map(str, sorted(nums, reverse=order == "descending"))),
        )
    if k == 2:
        words = [rng.choice(ADJS + OBJECTS + ANIMALS) for _ in range(rng.randint(3, 9))]
        return f"Reverse the order of these words: {' '.join(words)}", " ".join(reversed(words))
    if k == 3:
        target = lognormal_tokens(rng, 120, 1.0, 20, 3000)
        a, an, p = rng.choice(ADJS), rng.choice(ANIMALS), place(rng)
        return f"Write a short story about {art(a)} {an} in {p}.", grow(story(rng), target)
    if k == 4:
        target = lognormal_tokens(rng, 80, 0.9, 15, 2000)
        text = grow(encyclopedia(rng), target)
        return f"Write an encyclopedia entry about the town of {text.splitlines()[0]}.", text
    if k == 5:
        n = rng.randint(2, 9)
        cat, bank = rng.choice([("animals", ANIMALS), ("objects", OBJECTS), ("foods", FOODS), ("jobs", JOBS)])
        items = rng.sample(bank, n)
        return f"List {n} {cat}.", "\n".join(f"{i}. {x}" for i, x in enumerate(items, 1))
    if k == 6:
        fn = code_function(rng)
        first = fn.splitlines()[0]
        return f"Write Python code that starts with `{first}`.", fn.rstrip()
    word = rng.choice(ADJS + ANIMALS + OBJECTS)
    v = sum(ch in "aeiou" for ch in word)
    return f'How many vowels are in the word "{word}"?', f'The word "{word}" has {v} vowel{"s" if v != 1 else ""}.'


SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful tutor who shows your work.",
    "Answer briefly and correctly.",
    "You are a friendly storyteller.",
]


def make_sft(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        q, a = sft_task(rng)
        rows.append({"prompt": f"{q}\n", "completion": a})
    return rows


def make_chat(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for _turn in range(rng.choice([1, 1, 2, 2, 3, 4])):
            if msgs and msgs[-1]["role"] == "assistant" and rng.random() < 0.3:
                msgs += [
                    {"role": "user", "content": rng.choice(["Thanks!", "Great, thank you.", "Got it."])},
                    {"role": "assistant", "content": rng.choice(["You're welcome.", "Happy to help!", "Any time."])},
                ]
                continue
            q, a = sft_task(rng)
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        rows.append({"messages": msgs})
    return rows


# --------------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def percentiles(values: list[int]) -> dict:
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {
        "count": len(v),
        "min": v[0],
        "p10": pick(0.1),
        "p50": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        "max": v[-1],
        "mean": round(sum(v) / len(v), 1),
        "total": sum(v),
        "lt16": sum(x < 16 for x in v),
        "gt1024": sum(x > 1024 for x in v),
        "gt2048": sum(x > 2048 for x in v),
    }


def generate(out: Path, seed: int = SEED) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(random.Random(seed), N_CORPUS)
    sft = make_sft(random.Random(seed + 1), N_SFT)
    chat = make_chat(random.Random(seed + 2), N_CHAT)
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "sft.jsonl", sft)
    write_jsonl(out / "sft_chat.jsonl", chat)
    texts = [d["text"] for d in corpus] + [r["prompt"] + r["completion"] for r in sft]
    texts += [m["content"] for r in chat for m in r["messages"]]
    train_tokenizer(texts, out / "tokenizer")

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    enc = lambda xs: [len(ids) for ids in tok(xs, add_special_tokens=False)["input_ids"]]  # noqa: E731
    chat_lens = [
        len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]) for r in chat
    ]
    stats = {
        "seed": seed,
        "vocab_size": len(tok),
        "corpus_tokens": percentiles(enc([d["text"] for d in corpus])),
        "sft_tokens": percentiles(enc([r["prompt"] + r["completion"] for r in sft])),
        "sft_chat_tokens": percentiles(chat_lens),
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix != ".py" and p.name != "README.md"
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="output directory")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true", help="regenerate in a temp dir and compare with --out")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp), args.seed)
            new, old = _digest(Path(tmp)), _digest(args.out)
            bad = sorted(k for k in new if new[k] != old.get(k))
            print("identical" if not bad else f"DIFFERENT: {bad}")
            raise SystemExit(1 if bad else 0)
    stats = generate(args.out, args.seed)
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
