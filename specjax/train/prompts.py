"""Synthetic chat prompts for self-distillation.

The prompt sets in the shared data folder give ~260 chat prompts once the held-out evaluation sets
(MT-bench, EAGLE's qa) are set aside: too few for a drafter to learn a 135M target's habits. The
target writes the answers either way (the drafter learns the target, not the prompts' authors), so
what the prompts need is breadth: the kinds of request a chat model gets (writing, role play,
reasoning, arithmetic, code, extraction from a text, science and humanities questions) over many
topics. This module builds them from templates, topic lists and passages of the shared texts
(TinyStories train head, Tiny Shakespeare), deterministically from a seed.

None of these prompts is taken from an evaluation set; MT-bench's questions are never read here.
Four code tasks and one topic ask what evaluation turns ask, though
(specjax.train.evaluation_like).
"""

from __future__ import annotations

import random

from specjax.paths import shared_dir

TOPICS = (
    "climate change",
    "the history of the printing press",
    "healthy sleep habits",
    "electric cars",
    "remote work",
    "learning a second language",
    "the water cycle",
    "ancient Rome",
    "volcanoes",
    "personal budgeting",
    "social media and teenagers",
    "space exploration",
    "recycling",
    "the human immune system",
    "photosynthesis",
    "renewable energy",
    "the French Revolution",
    "artificial intelligence",
    "public libraries",
    "urban gardening",
    "the Olympic Games",
    "honeybees",
    "coffee",
    "the internet",
    "friendship",
    "time management",
    "the ocean",
    "jazz music",
    "chess",
    "video games",
    "democracy",
    "vaccines",
    "earthquakes",
    "the moon landing",
    "dinosaurs",
    "cooking at home",
    "exercise",
    "public transport",
    "the Renaissance",
    "black holes",
    "rain forests",
    "the stock market",
    "smartphones",
    "volunteering",
    "dogs as pets",
    "the Great Wall of China",
    "minimalism",
    "solar panels",
    "the Industrial Revolution",
    "mountain climbing",
    "photography",
    "national parks",
    "online privacy",
    "the theory of evolution",
    "bread baking",
    "the Silk Road",
    "chocolate",
    "robots in factories",
    "meditation",
    "board games",
    "city planning",
    "the Roman alphabet",
    "wind turbines",
    "the printing of money",
    "birds migrating",
    "first aid",
    "movies",
    "poetry",
    "gratitude",
    "a rainy day",
    "summer holidays",
)

WRITING = (
    "Write a short blog post about {topic}.",
    "Write a persuasive paragraph arguing that everyone should care about {topic}.",
    "Write a poem about {topic}.",
    "Write a short story in which {topic} plays an important role.",
    "Compose a friendly email to a colleague about {topic}.",
    "Write a product description for a new book about {topic}.",
    "Draft a speech for a school assembly about {topic}.",
    "Write a haiku about {topic}, then explain it.",
    "Write an introduction for an essay on {topic}.",
    "Write a limerick about {topic}.",
)

ROLEPLAY = (
    "Pretend you are a tour guide. Tell a group of visitors about {topic}.",
    "Act as a teacher and explain {topic} to a class of ten-year-olds.",
    "Imagine you are a journalist interviewing an expert on {topic}. Write three questions and "
    "the expert's answers.",
    "You are a friendly robot who has just learned about {topic}. Describe it in your own words.",
    "Role-play a conversation between two friends who disagree about {topic}.",
    "You are a detective. Explain how {topic} helped you solve your latest case.",
    "Pretend to be a famous scientist giving advice about {topic}.",
)

KNOWLEDGE = (
    "Explain {topic} in simple terms.",
    "What are the main advantages and disadvantages of {topic}?",
    "Give me five interesting facts about {topic}.",
    "How has {topic} changed over the last hundred years?",
    "What should a beginner know about {topic}?",
    "Summarize the most important ideas about {topic} in a few bullet points.",
    "Why is {topic} important?",
    "Compare {topic} and {topic2}.",
    "What are common misconceptions about {topic}?",
    "Describe the history of {topic}.",
)

CODE_TASKS = (
    "reverses a string",
    "checks whether a number is prime",
    "returns the factorial of n",
    "counts the vowels in a string",
    "finds the largest number in a list",
    "removes duplicates from a list while keeping the order",
    "computes the n-th Fibonacci number",
    "checks whether a string is a palindrome",
    "merges two sorted lists",
    "returns the sum of the digits of an integer",
    "converts Celsius to Fahrenheit",
    "counts how often each word appears in a sentence",
    "flattens a nested list",
    "returns the second smallest element of a list",
    "sorts a list of names by length",
    "computes the average of a list of numbers",
    "checks whether two strings are anagrams",
    "finds the greatest common divisor of two numbers",
    "capitalizes every word in a sentence",
    "returns all even numbers from a list",
    "implements binary search",
    "reads a text file and counts its lines",
    "transposes a matrix given as a list of lists",
)

CODE = (
    "Write a Python function that {task}.",
    "Write a Python function that {task}, and explain how it works.",
    "Write a JavaScript function that {task}.",
    "How would you write a program that {task}? Give the code and a short explanation.",
    "Write a C function that {task}.",
)

NAMES = ("Anna", "Ben", "Carlos", "Dana", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jack")
ITEMS = ("apples", "books", "pencils", "marbles", "stickers", "cookies", "stamps", "cards")


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 9)
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    forms = (
        f"{name} has {a} {item}. {other} gives {name} {b} more, and then {name} shares them "
        f"equally among {c} friends. How many {item} does each friend get, and how many are left?",
        f"A shop sells {item} for {c} dollars each. {name} buys {b} of them and pays with a "
        f"{c * b + a}-dollar bill. How much change does {name} get?",
        f"What is {a} times {b}, plus {c}? Show your steps.",
        f"A train travels {a * c} kilometers in {c} hours. What is its average speed? How far "
        f"does it go in {b} hours at that speed?",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{name} reads {b} pages a day. How many days does it take to read a book of "
        f"{a * b + c} pages?",
        f"If {c} workers build a wall in {b} days, how long would {c * 2} workers take? Explain "
        "your reasoning.",
    )
    return rng.choice(forms)


REASONING = (
    "If all {x} are {y} and some {y} are green, can we conclude that some {x} are green? Explain.",
    "{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest? Explain step by "
    "step.",
    "There are three boxes: one holds only apples, one only oranges, one both. All labels are "
    "wrong. You may take one fruit from one box. How do you label the boxes correctly?",
    "{a} is older than {b}. {c} is younger than {b}. Is {a} older than {c}? Why?",
    "A farmer has {n} sheep and all but {k} run away. How many are left? Explain the trick.",
    "Which is heavier, a kilogram of feathers or a kilogram of {item}? Explain.",
)

PASSAGE = (
    "Summarize the following story in two sentences.\n\n{text}",
    "Read the story below and list every character and what each one does.\n\n{text}",
    "What is the moral of this story?\n\n{text}",
    "Rewrite this story from the point of view of another character.\n\n{text}",
    "Answer in one word whether this story is happy or sad, then explain why.\n\n{text}",
    "Write three questions a teacher could ask about this story, with answers.\n\n{text}",
    "Continue this story with a surprising ending.\n\n{text}",
)

VERSE = (
    "Explain this passage from Shakespeare in modern English:\n\n{text}",
    "Who might be speaking in this passage, and what do they want?\n\n{text}",
    "Summarize what happens in this scene:\n\n{text}",
    "Rewrite these lines as a modern conversation:\n\n{text}",
)


def _paragraphs(name: str, min_words: int = 40, max_words: int = 160) -> list[str]:
    text = (shared_dir() / "data" / name).read_text(encoding="utf-8")
    paras = [" ".join(p.split()) for p in text.split("\n\n")]
    return [p for p in paras if min_words <= len(p.split()) <= max_words]


def _verse_chunks(lines_per_chunk: int = 8) -> list[str]:
    text = (shared_dir() / "data" / "tinyshakespeare_input.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    return [
        "\n".join(lines[i : i + lines_per_chunk])
        for i in range(0, len(lines) - lines_per_chunk, lines_per_chunk)
    ]


def synthetic_prompts(n: int, seed: int = 0) -> list[str]:
    """n user turns (plain text, no chat template), drawn with `seed` from the families above in
    fixed proportions; deterministic for (n, seed)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    stories, verses = _paragraphs("tinystories_train_head.txt"), _verse_chunks()

    def pick_topic():
        return rng.choice(TOPICS)

    families = (
        (3, lambda: rng.choice(WRITING).format(topic=pick_topic())),
        (2, lambda: rng.choice(ROLEPLAY).format(topic=pick_topic())),
        (4, lambda: rng.choice(KNOWLEDGE).format(topic=pick_topic(), topic2=pick_topic())),
        (2, lambda: rng.choice(CODE).format(task=rng.choice(CODE_TASKS))),
        (2, lambda: _math_prompt(rng)),
        (
            1,
            lambda: rng.choice(REASONING).format(
                x=rng.choice(("cats", "robots", "trees", "teachers")),
                y=rng.choice(("animals", "machines", "plants", "people")),
                a=rng.choice(NAMES),
                b=rng.choice(NAMES[::-1]),
                c=rng.choice(NAMES[1::2]),
                n=rng.randint(10, 30),
                k=rng.randint(2, 9),
                item=rng.choice(("iron", "stone", "sand")),
            ),
        ),
        (2, lambda: rng.choice(PASSAGE).format(text=rng.choice(stories))),
        (1, lambda: rng.choice(VERSE).format(text=rng.choice(verses))),
    )
    weights = [w for w, _ in families]
    out, seen = [], set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        make = rng.choices([f for _, f in families], weights)[0]
        text = make()
        # Prefer distinct prompts; after many collisions (small template space) allow repeats.
        if text in seen and attempts < 20 * n:
            continue
        seen.add(text)
        out.append(text)
    return out
