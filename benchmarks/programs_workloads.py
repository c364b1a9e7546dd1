"""The programs and inputs of benchmarks/programs.py: four workloads in the shape of the SGLang
paper's benchmarks (few-shot MMLU with select, tree-of-thought, an LLM judge with fork/join, and
multi-turn chat). Every input is made up here from a fixed seed; all decoding is greedy.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import radixrt as rx

WORKLOADS = ("few-shot", "tree-of-thought", "llm-judge", "multi-turn-chat")
LETTERS = (" A", " B", " C", " D")


@dataclass(frozen=True)
class Sizes:
    """How big each program is (the --quick preset shrinks these)."""

    shots: int = 30  # few-shot examples in the shared prefix (30, all of them: ~1,100 tokens)
    tot_tokens: int = 16  # tree-of-thought: max_tokens of each gen
    judge_tokens: int = 24  # llm-judge: max_tokens of each aspect (stopped at a newline)
    chat_turns: int = 4
    chat_tokens: int = 24  # multi-turn chat: max_tokens of each answer


@dataclass
class Workload:
    name: str
    program: rx.Program
    inputs: list[dict[str, Any]]
    outcome: Callable[[rx.ProgramState], Any]  # what two systems should agree on
    describe: str


# --- few-shot multiple choice (MMLU-style) -----------------------------------------------------
FEW_SHOT_HEADER = (
    "The following are multiple choice questions (with answers) about general knowledge, "
    "science and arithmetic.\n\n"
)
# (question, four options, index of the right one): made up, MMLU-shaped
EXAMPLES: list[tuple[str, tuple[str, str, str, str], int]] = [
    ("Which planet is closest to the Sun?", ("Venus", "Mercury", "Earth", "Mars"), 1),
    ("What is the chemical symbol for sodium?", ("So", "Sd", "Na", "S"), 2),
    ("How many sides does a hexagon have?", ("5", "6", "7", "8"), 1),
    ("Which gas do plants mainly take in for photosynthesis?",
     ("Oxygen", "Nitrogen", "Hydrogen", "Carbon dioxide"), 3),
    ("What is 12 multiplied by 11?", ("121", "132", "144", "122"), 1),
    ("Which organ pumps blood through the human body?", ("Heart", "Liver", "Lung", "Kidney"), 0),
    ("Water boils at sea level at what temperature in degrees Celsius?",
     ("90", "100", "110", "120"), 1),
    ("Which of these is a prime number?", ("21", "27", "29", "33"), 2),
    ("Who wrote the play Romeo and Juliet?",
     ("Charles Dickens", "Jane Austen", "Mark Twain", "William Shakespeare"), 3),
    ("What is the largest ocean on Earth?", ("Atlantic", "Indian", "Pacific", "Arctic"), 2),
    ("Which unit measures electrical resistance?", ("Volt", "Ohm", "Ampere", "Watt"), 1),
    ("In which continent is Kenya located?", ("Africa", "Asia", "Europe", "South America"), 0),
    ("What is the square root of 81?", ("7", "8", "9", "10"), 2),
    ("Which layer of the atmosphere contains the ozone layer?",
     ("Troposphere", "Stratosphere", "Mesosphere", "Thermosphere"), 1),
    ("Which data structure works first in, first out?", ("Stack", "Tree", "Queue", "Heap"), 2),
    ("What is the main language spoken in Brazil?",
     ("Spanish", "Portuguese", "French", "English"), 1),
    ("How many minutes are there in three hours?", ("120", "150", "180", "200"), 2),
    ("Which particle has a negative electric charge?",
     ("Proton", "Neutron", "Photon", "Electron"), 3),
    ("Which instrument is used to measure air pressure?",
     ("Thermometer", "Barometer", "Hygrometer", "Odometer"), 1),
    ("What is 15 percent of 200?", ("15", "20", "30", "45"), 2),
    ("Which metal is liquid at room temperature?", ("Mercury", "Iron", "Copper", "Tin"), 0),
    ("What is the capital city of Canada?", ("Toronto", "Vancouver", "Ottawa", "Montreal"), 2),
    ("Which blood cells fight infections?",
     ("Red blood cells", "White blood cells", "Platelets", "Plasma cells"), 1),
    ("How many degrees are in a right angle?", ("45", "60", "90", "180"), 2),
    ("Which force keeps the planets in orbit around the Sun?",
     ("Magnetism", "Friction", "Gravity", "Tension"), 2),
    ("What is the plural of the word mouse?", ("Mouses", "Mice", "Meese", "Mousen"), 1),
    ("Which number comes next in the sequence 2, 4, 8, 16?", ("18", "24", "32", "20"), 2),
    ("Which part of a plant carries water from the roots to the leaves?",
     ("Xylem", "Phloem", "Petal", "Pollen"), 0),
    ("A train travels 60 kilometres in one hour. How far does it go in four hours?",
     ("200 km", "240 km", "260 km", "300 km"), 1),
    ("Which of these animals is a mammal?", ("Shark", "Frog", "Dolphin", "Lizard"), 2),
]


def mc_block(question: str, options: tuple[str, ...] | list[str]) -> str:
    lines = [f"Question: {question}"]
    lines += [f"{letter.strip()}. {opt}" for letter, opt in zip(LETTERS, options)]
    return "\n".join(lines) + "\nAnswer:"


def few_shot_prefix(shots: int) -> str:
    blocks = [mc_block(q, opts) + LETTERS[right] + "\n\n" for q, opts, right in EXAMPLES[:shots]]
    return FEW_SHOT_HEADER + "".join(blocks)


def arithmetic_question(rng: random.Random) -> tuple[str, list[str]]:
    """A made-up question with four options (the right one is somewhere among them)."""
    kind = rng.randrange(4)
    a, b = rng.randint(3, 60), rng.randint(3, 40)
    if kind == 0:
        question, right = f"What is {a} plus {b}?", a + b
    elif kind == 1:
        question, right = f"What is {a} multiplied by {b}?", a * b
    elif kind == 2:
        question, right = f"How many minutes are there in {b} hours?", 60 * b
    else:
        question, right = f"A box holds {b} apples. How many apples are in {a} boxes?", a * b
    options = {right}
    while len(options) < 4:
        options.add(max(1, right + rng.choice((-1, 1)) * rng.randint(1, 12)))
    shuffled = sorted(options, key=lambda _: rng.random())
    return question, [str(x) for x in shuffled]


def make_few_shot(prefix: str) -> rx.Program:
    @rx.function
    def few_shot(s, question, options):
        s += prefix  # its own `+=`, so that run_batch's tracing finds the constant prefix
        s += mc_block(question, options)
        s += rx.select("answer", list(LETTERS))

    return few_shot


def few_shot_workload(n: int, sizes: Sizes, rng: random.Random) -> Workload:
    inputs = []
    for _ in range(n):
        question, options = arithmetic_question(rng)
        inputs.append({"question": question, "options": options})
    program = make_few_shot(few_shot_prefix(sizes.shots))
    return Workload("few-shot", program, inputs, lambda st: st["answer"],
                    f"{sizes.shots}-shot prefix, select of 4 letters")


# --- tree-of-thought ----------------------------------------------------------------------------
TOT_HEADER = (
    "Solve the problem by thinking about it in a few different ways, then pick the answer.\n"
)


@rx.function
def tree_of_thought(s, question, options, max_tokens):
    think = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    s += TOT_HEADER
    s += f"Problem: {question}\n"
    plans = s.fork(2)
    for i, plan in enumerate(plans):
        plan += f"Approach {i + 1}:" + rx.gen("plan", **think)
    groups = []  # fork every plan before joining any, so that all four steps run at once
    for plan in plans:  # (fork waits for the plan's gen: queue all the plans first)
        steps = plan.fork(2)
        for j, step in enumerate(steps):
            step += f"\nStep {j + 1}:" + rx.gen("step", **think)
        groups.append(steps)
    for steps in groups:
        steps.join()  # plan["step"]: its 2 steps
    plans.join()  # s["plan"]: the 2 plans
    ideas = [f"- {plan['plan'].strip()} {' '.join(x.strip() for x in plan['step'])}"
             for plan in plans]
    s += "Ideas:\n" + "\n".join(ideas) + "\n" + mc_block(question, options)
    s += rx.select("answer", list(LETTERS))


def tree_of_thought_workload(n: int, sizes: Sizes, rng: random.Random) -> Workload:
    inputs = []
    for _ in range(n):
        question, options = arithmetic_question(rng)
        inputs.append({"question": question, "options": options,
                       "max_tokens": sizes.tot_tokens})
    return Workload("tree-of-thought", tree_of_thought, inputs, lambda st: st["answer"],
                    f"fork 2 x 2, 6 gens of {sizes.tot_tokens} tokens, select of 4")


# --- LLM judge (fork/join) ---------------------------------------------------------------------
JUDGE_SYSTEM = (
    "You are a careful reviewer of short articles. For each aspect you are asked about, answer "
    "with one short sentence on a single line."
)
ASPECTS = ("clarity", "accuracy", "style")
VERDICTS = ("good", "bad")
TOPICS = ("the Moon", "honey bees", "volcanoes", "the printing press", "coral reefs",
          "the water cycle", "electric cars", "the Roman roads", "glaciers", "tea")
SENTENCES = (
    "{t} has been studied by scientists for a very long time.",
    "Many people find {t} fascinating because it touches everyday life.",
    "Some early accounts of {t} were wrong, and later work corrected them.",
    "Today, {t} is explained in most school textbooks.",
    "Researchers measure {t} with simple tools as well as with satellites.",
    "A common myth is that {t} never changes, but it changes slowly over time.",
    "Writers often use {t} as a symbol of patience.",
    "The history of {t} shows how ideas spread from one country to another.",
    "Experts disagree about some details of {t}, but agree on the main points.",
    "Learning about {t} helps people understand the world around them.",
)


def article(rng: random.Random) -> str:
    topic = rng.choice(TOPICS)
    picked = rng.sample(SENTENCES, 6)
    sentences = [x.format(t=topic) for x in picked]
    body = " ".join(x[0].upper() + x[1:] for x in sentences)
    return f"Title: A short note on {topic}\n\n{body}"


@rx.function
def llm_judge(s, text, max_tokens):
    s += rx.system(JUDGE_SYSTEM)
    s += rx.user("Article:\n" + text)
    forks = s.fork(len(ASPECTS))
    for f, aspect in zip(forks, ASPECTS):
        f += rx.user(f"Rate the {aspect} of the article in one sentence.")
        f += rx.assistant(rx.gen("opinion", max_tokens=max_tokens, stop="\n", temperature=0))
    forks.join()
    s += rx.user("Is the article good or bad overall? Answer with one word.")
    s += rx.assistant(rx.select("verdict", list(VERDICTS)))


def llm_judge_workload(n: int, sizes: Sizes, rng: random.Random) -> Workload:
    inputs = [{"text": article(rng), "max_tokens": sizes.judge_tokens} for _ in range(n)]
    return Workload("llm-judge", llm_judge, inputs,
                    lambda st: (st["verdict"], tuple(st["opinion"])),
                    f"fork 3 aspects (gen <= {sizes.judge_tokens}, stop \\n), select of 2")


# --- multi-turn chat ---------------------------------------------------------------------------
CHAT_SYSTEM = (
    "You are a friendly and patient tutor for curious students. Keep every answer short, "
    "concrete and correct. Use plain words, avoid jargon, and give one small example when it "
    "helps. If a question is unclear, say what you assume. Never invent facts: when you are not "
    "sure, say so. Stay on the topic the student asks about, and build on earlier answers in the "
    "conversation instead of repeating them."
)
CHAT_TOPICS = (
    "Why is the sky blue?", "How do plants drink water?", "What makes a rainbow?",
    "Why do we have seasons?", "How does a magnet work?", "What is an atom made of?",
    "Why does ice float on water?", "How do bees make honey?", "What causes thunder?",
    "How does the heart pump blood?", "Why do leaves change colour?", "What is gravity?",
    "How do airplanes stay in the air?", "Why is the sea salty?", "What is a black hole?",
    "How do vaccines work?",
)
FOLLOW_UPS = (
    "Can you give an example?", "Why does that happen?", "Can you say that more simply?",
    "What is a common mistake about this?", "How do scientists know that?",
)


@rx.function
def multi_turn_chat(s, questions, max_tokens):
    s += rx.system(CHAT_SYSTEM)
    for i, question in enumerate(questions):
        s += rx.user(question)
        s += rx.assistant(rx.gen(f"answer_{i}", max_tokens=max_tokens, temperature=0,
                                 ignore_eos=True))


def multi_turn_chat_workload(n: int, sizes: Sizes, rng: random.Random) -> Workload:
    inputs = []
    for _ in range(n):  # a topic, then follow-ups or other topics
        first = rng.choice(CHAT_TOPICS)
        rest = rng.sample([q for q in CHAT_TOPICS + FOLLOW_UPS if q != first],
                          sizes.chat_turns - 1)
        inputs.append({"questions": [first, *rest], "max_tokens": sizes.chat_tokens})
    turns = sizes.chat_turns
    return Workload("multi-turn-chat", multi_turn_chat, inputs,
                    lambda st: tuple(st[f"answer_{i}"] for i in range(turns)),
                    f"{turns} turns of {sizes.chat_tokens} tokens, shared system prompt")


# --- warm-up -----------------------------------------------------------------------------------
@rx.function
def warm_up_program(s):
    s += "The capital of France is"
    s += rx.gen("city", max_tokens=4, temperature=0, ignore_eos=True)
    s += ". True or false:" + rx.select("tf", [" true", " false"])


MAKERS: dict[str, Callable[[int, Sizes, random.Random], Workload]] = {
    "few-shot": few_shot_workload,
    "tree-of-thought": tree_of_thought_workload,
    "llm-judge": llm_judge_workload,
    "multi-turn-chat": multi_turn_chat_workload,
}


def build_workloads(names: list[str], n: int, sizes: Sizes, seed: int) -> list[Workload]:
    return [MAKERS[name](n, sizes, random.Random(f"{seed}-{name}")) for name in names]
