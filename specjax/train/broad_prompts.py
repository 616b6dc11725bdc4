"""Broad synthetic chat prompts: the eight kinds of request a chat assistant is benchmarked on
(writing, role play, reasoning, math, coding, extraction, STEM, humanities), with constraints on
form, audience and length, and documents to work on built from random fields.

Why a second generator: drafters trained on the answers to specjax.train.prompts (short, one-line
requests over ~90 everyday topics) predicted the target's next token 48% of the time on held-out
prompts of the same generator but 36% on MT-bench first turns, and 9% of the tokens the target
writes there were outside their draft vocabulary. The target writes the answers either way, so
what the prompts control is which parts of the target's behaviour the drafter sees: here longer,
multi-part requests, named people and places, numbers, code and technical vocabulary.

No evaluation question (MT-bench or any EAGLE question file) is read here. Some templates
resemble MT-bench turns, though (the remainder of twice a number, f(x) = c x^3 - b x + a, the
brothers-and-sisters riddle, ...: specjax.train.evaluation_like lists them). They stay, so that
the committed smollm2-broad answers keep matching their generator: drafters leave those answers
out (DrafterRecipe.drop_evaluation_like), and a new answer set skips those turns as it draws
(DistillConfig.skip_evaluation_like, on for `specjax train-drafter`).
"""

from __future__ import annotations

import random

from specjax.train.prompts import CODE_TASKS, TOPICS, _paragraphs

PLACES = (
    "Kyoto", "Lisbon", "Iceland", "Patagonia", "Marrakech", "the Scottish Highlands", "Vancouver",
    "Cape Town", "Hanoi", "the Amalfi Coast", "New Zealand", "Istanbul", "Peru", "Norway",
    "Bali", "Prague", "the Grand Canyon", "Seoul", "Buenos Aires", "Crete", "Nairobi", "Quebec",
)  # fmt: skip
PEOPLE = (
    "a retired astronaut", "a medieval blacksmith", "a pirate captain", "a Victorian detective",
    "a startup founder", "a grumpy chef", "a kind librarian", "a Roman senator",
    "a deep-sea diver", "a jazz musician from the 1920s", "a wise old tree", "a time traveller",
    "a nervous job applicant", "a football coach at half time", "a park ranger",
    "a fashion designer", "an ancient Greek philosopher", "a superhero on their day off",
    "a customer service agent", "a marine biologist", "a stand-up comedian", "a news anchor",
)  # fmt: skip
AUDIENCES = (
    "a ten-year-old", "a busy manager", "a first-year university student", "a retired teacher",
    "a group of tourists", "an expert in the field", "a skeptical investor", "my grandmother",
)  # fmt: skip
FORMATS = (
    "Use exactly three paragraphs.", "Answer in fewer than 100 words.",
    "Use a numbered list.", "Include a catchy title.", "End with a question for the reader.",
    "Use bullet points and bold headings.", "Keep a humorous tone.", "Write it in a formal tone.",
    "Start every sentence with a different letter.", "Include at least two examples.", "",
    "", "",
)  # fmt: skip
PRODUCTS = (
    "a solar-powered backpack", "a smart water bottle", "noise-cancelling headphones",
    "a foldable electric bike", "an AI-powered language tutor", "a plant-based burger",
    "a budgeting app for students", "a reusable notebook", "a robot vacuum cleaner",
    "a subscription box for board games", "a meditation app", "an electric pickup truck",
)  # fmt: skip
STEM = (
    "the second law of thermodynamics", "natural selection", "CRISPR",
    "plate tectonics", "the greenhouse effect", "neural networks", "the Doppler effect",
    "photosynthesis", "black holes", "antibiotic resistance", "the Pythagorean theorem",
    "DNA replication", "nuclear fusion", "entropy", "the speed of light", "vaccines",
    "semiconductors", "public-key cryptography", "the immune response", "ocean acidification",
    "gravitational waves", "machine learning", "the periodic table", "supply and demand",
    "compound interest", "the placebo effect", "blockchain", "climate feedback loops",
)  # fmt: skip
HUMANITIES = (
    "the causes of the First World War", "the Renaissance", "Stoic philosophy",
    "the Industrial Revolution", "the role of myth in ancient cultures", "existentialism",
    "the invention of writing", "the Cold War", "colonialism in Africa", "the Enlightenment",
    "the Silk Road", "utilitarian ethics", "impressionist painting", "the printing press",
    "the fall of the Roman Empire", "globalization", "the civil rights movement",
    "free will", "the history of democracy", "modern architecture",
    "minimalism in music", "Shakespeare's tragedies", "the Meiji Restoration",
)  # fmt: skip
LANGUAGES = ("Python", "Python", "Python", "JavaScript", "C++", "Java", "SQL", "Rust", "Go")

WRITING = (
    "Compose a persuasive essay arguing for {topic}. Address one counterargument. {fmt}",
    "Write a short story that begins with the sentence: 'Nobody expected the letter from "
    "{place}.' {fmt}",
    "Draft a product launch announcement for {product}, aimed at {audience}. {fmt}",
    "Write a poem about {topic} in the style of a sea shanty.",
    "Write a speech for the opening of a new museum about {topic}. {fmt}",
    "Write a short film script in which {person} meets {person2}. Include stage directions.",
    "Write a cover letter for a job at a company that works on {topic}. {fmt}",
    "Rewrite the following sentence in five different tones (formal, casual, sad, excited, "
    "sarcastic): 'The meeting about {topic} has been moved to Friday.'",
    "Write a restaurant review of a fictional restaurant in {place}. {fmt}",
    "Write a letter to a city council about {topic}, proposing one concrete change. {fmt}",
    "Write a packing list and a short itinerary for a hiking weekend near {place}.",
    "Write a diary entry of {person} on the day they discovered {topic}.",
    "Create a social media post promoting {product}, with three hashtags.",
    "Write a letter from {person} to their younger self. {fmt}",
    "Describe a vivid, unusual character in two paragraphs, using strong imagery.",
    "Write an outline for a blog post comparing {topic} and {topic2}. {fmt}",
)
ROLEPLAY = (
    "Pretend you are {person}. Stay in character and tell me about your typical day.",
    "Act as {person} and give me advice about {topic}. Do not break character.",
    "You are {person}. A visitor asks you what you think about {topic}. Answer in character.",
    "Imagine you are a travel agent. Plan a three-day trip to {place} for {audience}.",
    "Act as a personal trainer. Create a weekly plan for someone who wants to start running.",
    "You are a doctor. A patient describes a persistent headache and trouble sleeping. What "
    "questions do you ask, and what do you recommend?",
    "Pretend to be a museum guide standing in front of an exhibit about {topic}.",
    "You are an interviewer for a software company. Ask me three questions about {lang}, one "
    "at a time, and explain what a good answer would include.",
    "Play the role of a mediator between two neighbours arguing about a noisy dog.",
    "Act as a chef and explain how to cook a traditional dish from {place}.",
    "You are {person} writing a review of {product}. Stay in character.",
    "Imagine you are a spaceship's computer talking to the crew about a problem with the "
    "engines. Describe the situation and your plan.",
)
REASONING = (
    "{a} is taller than {b}. {c} is shorter than {b} but taller than {d}. Rank all four from "
    "tallest to shortest and explain your reasoning.",
    "A bat and a ball cost {total} dollars in total. The bat costs {diff} dollars more than the "
    "ball. How much does the ball cost? Think step by step.",
    "If it takes {k} machines {k} minutes to make {k} widgets, how long would {m} machines take "
    "to make {m} widgets? Explain.",
    "Every morning {a} either walks or cycles to work. If it rains, {a} never cycles. Today {a} "
    "cycled. What can we conclude about the weather? Explain.",
    "There are {n} people in a room and each shakes hands with every other person once. How "
    "many handshakes happen? Explain the reasoning.",
    "{a} says: 'I always lie.' Is this statement true or false? Discuss the paradox.",
    "A family has {n} children. Each daughter has as many brothers as sisters, and each son has "
    "twice as many sisters as brothers. Is that possible? Reason it out.",
    "Which weighs more: {k} kilograms of feathers or {m} kilograms of bricks? Explain.",
    "Three friends, {a}, {b} and {c}, each own a different pet: a cat, a dog and a parrot. {a} "
    "is allergic to fur, and {b} does not own the dog. Who owns which pet?",
    "A clock shows {h}:{mm}. What is the angle between the hour and minute hands? Explain.",
    "Is the following argument valid? 'All {x} are {y}. Some {y} are loud. Therefore some {x} "
    "are loud.' Explain why or why not.",
)
STEM_Q = (
    "Explain {stem} to {audience}. {fmt}",
    "What is {stem}, and why does it matter in everyday life?",
    "Describe how {stem} works, step by step, and give a real-world example.",
    "What are the most common misconceptions about {stem}?",
    "Compare {stem} and {stem2}: how are they related and how do they differ?",
    "Design a simple experiment a high-school class could do to demonstrate {stem}.",
    "What open research questions remain about {stem}?",
    "Summarize the history of how scientists came to understand {stem}. {fmt}",
)
HUMANITIES_Q = (
    "Discuss {hum} and its long-term consequences. {fmt}",
    "What can we learn today from {hum}?",
    "Explain {hum} to {audience}.",
    "Compare {hum} with {hum2}. What do they have in common?",
    "What were the main arguments for and against {hum}?",
    "Write a short essay on how {hum} shaped the modern world. {fmt}",
    "Give three perspectives on {hum}: a historian's, an economist's and an artist's.",
    "How might history have changed without {hum}? Speculate carefully.",
)
CODE = (
    "Write a {lang} function that {task}. Include comments and an example.",
    "Implement a program in {lang} that {task}, and analyse its time complexity.",
    "Write a {lang} function that {task}, then write two unit tests for it.",
    "Explain, step by step, how to write a {lang} function that {task}.",
    "Here is a buggy Python function:\n\n```python\ndef average(xs):\n    total = 0\n    for x "
    "in xs:\n        total += x\n    return total / len(xs) + 1\n```\n\nFind the bug and fix it.",
    "What is the difference between a list and a tuple in Python? Give examples.",
    "Write an SQL query that finds the {k} customers with the highest total order value, given "
    "tables customers(id, name) and orders(id, customer_id, amount).",
    "Explain what recursion is and write a recursive {lang} function that {task}.",
    "Write a {lang} class that represents a bank account with deposit, withdraw and balance "
    "methods. Handle overdrafts.",
    "Describe how a hash map works and when you would use one instead of a list.",
    "Write a regular expression that matches valid email addresses and explain each part.",
    "Write a Python script that reads a CSV file of {things} and prints the average of the "
    "'price' column.",
    "Implement {algo} in {lang} and explain how it works.",
)
ALGORITHMS = (
    "quicksort", "merge sort", "breadth-first search", "Dijkstra's algorithm", "binary search",
    "a stack using two queues", "a linked list", "the sieve of Eratosthenes",
    "dynamic programming for the longest common subsequence", "an LRU cache",
)  # fmt: skip


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(2, 12)
    forms = (
        f"Solve the system of equations: {a}x + {b}y = {a * c + b}, x - y = {c - 1}.",
        f"A bag holds {a} red and {b} blue marbles. Two are drawn without replacement. What is the "
        "probability that both are red?",
        f"Find all real solutions of x^2 - {a + b}x + {a * b} = 0.",
        f"If f(x) = {c}x^3 - {b}x + {a}, find f({c}) and f'(x).",
        f"A company's revenue grew from {a * 1000} dollars to {a * 1000 + b * 250} dollars in one "
        "year. What was the percentage growth?",
        f"What is the sum of all integers from 1 to {a * 10}? Show a quick method.",
        f"A circle has radius {c} cm. What are its circumference and area?",
        f"Prove that the sum of two odd numbers is even, then check it with {2 * a + 1} and "
        f"{2 * b + 1}.",
        f"When a number is divided by {c}, the remainder is {c - 1}. What is the remainder when "
        f"twice the number is divided by {c}?",
        f"{b} workers can paint a house in {c} days. How many days would {b + c} workers need?",
        f"Convert {a * 37} minutes into hours and minutes, then into seconds.",
        f"A rectangle's length is {c} more than its width, and its area is {a * (a + c)}. Find "
        "its dimensions.",
        f"What is {a}% of {b * 40}, and what number is {b * 40} {a}% of?",
    )
    return rng.choice(forms)


REVIEW_BITS = (
    ("brilliant", "a masterpiece with stunning visuals"),
    ("disappointing", "a slow plot and wooden acting"),
    ("fine", "some good moments but nothing memorable"),
    ("fantastic", "a soundtrack I still hum"),
    ("awful", "two hours I will never get back"),
)


def _document(rng: random.Random) -> str:
    """A short made-up document for extraction requests."""
    kind = rng.randrange(4)
    if kind == 0:
        rows = [
            f"{rng.choice(('Anna', 'Ben', 'Carla', 'Dev', 'Elif', 'Femi'))} bought "
            f"{rng.randint(1, 9)} {rng.choice(('chairs', 'lamps', 'desks', 'rugs'))} for "
            f"{rng.randint(20, 400)} dollars on {rng.choice(('Monday', 'Tuesday', 'Friday'))}."
            for _ in range(rng.randint(3, 6))
        ]
        return " ".join(rows)
    if kind == 1:
        reviews = []
        for i in range(3):
            mood, detail = rng.choice(REVIEW_BITS)
            reviews.append(f"{i + 1}. This movie was {mood}: {detail}.")
        return "\n".join(reviews)
    if kind == 2:
        return (
            f"Subject: Meeting about {rng.choice(TOPICS)}\nHi team, the meeting moves to "
            f"{rng.choice(('Monday', 'Wednesday', 'Thursday'))} at {rng.randint(9, 16)}:00 in room "
            f"{rng.randint(100, 450)}. Please bring the budget of {rng.randint(2, 90)}k dollars "
            f"and the draft by {rng.choice(('Dana', 'Omar', 'Lea'))}. Thanks, "
            f"{rng.choice(('Sam', 'Noor', 'Kai'))}"
        )
    return rng.choice(_STORIES)


EXTRACTION = (
    "Extract every person, number and date from the text below and return them as JSON.\n\n{doc}",
    "Summarize the text below in one sentence, then list its key facts.\n\n{doc}",
    "Turn the following text into a table with sensible columns.\n\n{doc}",
    "Identify the main topic and the tone of the following text.\n\n{doc}",
    "List the sentences of the text below that contain a number, then add up the numbers.\n\n{doc}",
    "Answer from the text only: who is mentioned, and what do they do?\n\n{doc}",
)

_STORIES: list[str] = []


FAMILIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)  # fmt: skip


def broad_prompts(n: int, seed: int = 0) -> list[str]:
    """n user turns (plain text, no chat template) drawn with `seed` from the eight families in
    equal proportions; deterministic for (n, seed), distinct where the template space allows."""
    return [text for _, text in broad_prompts_by_family(n, seed)]


def broad_prompts_by_family(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """broad_prompts(n, seed) with the family (one of FAMILIES) each prompt was drawn from."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not _STORIES:
        _STORIES.extend(_paragraphs("tinystories_train_head.txt"))
    rng = random.Random(seed)
    names = ("Alice", "Bruno", "Chen", "Divya", "Eric", "Fatima", "Gus", "Hana", "Ivan", "Jo")

    def fill(template: str) -> str:
        a, b, c, d = rng.sample(names, 4)
        p1, p2 = rng.sample(PEOPLE, 2)
        t1, t2 = rng.sample(TOPICS, 2)
        s1, s2 = rng.sample(STEM, 2)
        h1, h2 = rng.sample(HUMANITIES, 2)
        k, m = rng.randint(2, 9), rng.randint(10, 120)
        fields = {
            "place": rng.choice(PLACES),
            "person": p1,
            "person2": p2,
            "audience": rng.choice(AUDIENCES),
            "fmt": rng.choice(FORMATS),
            "topic": t1,
            "topic2": t2,
            "product": rng.choice(PRODUCTS),
            "stem": s1,
            "stem2": s2,
            "hum": h1,
            "hum2": h2,
            "lang": rng.choice(LANGUAGES),
            "task": rng.choice(CODE_TASKS),
            "algo": rng.choice(ALGORITHMS),
            "things": rng.choice(("books", "cars", "houses", "phones")),
            "a": a,
            "b": b,
            "c": c,
            "d": d,
            "n": rng.randint(2, 12),
            "k": k,
            "m": m,
            "total": f"{1 + k / 10:.2f}",
            "diff": "1.00",
            "h": rng.randint(1, 12),
            "mm": f"{rng.choice((0, 15, 20, 30, 45, 50)):02d}",
            "x": rng.choice(("cats", "robots", "poets", "engineers")),
            "y": rng.choice(("animals", "machines", "artists", "people")),
            "doc": _document(rng),
        }
        return template.format(**fields).strip()

    families = {
        "writing": lambda: fill(rng.choice(WRITING)),
        "roleplay": lambda: fill(rng.choice(ROLEPLAY)),
        "reasoning": lambda: fill(rng.choice(REASONING)),
        "math": lambda: _math(rng),
        "coding": lambda: fill(rng.choice(CODE)),
        "extraction": lambda: fill(rng.choice(EXTRACTION)),
        "stem": lambda: fill(rng.choice(STEM_Q)),
        "humanities": lambda: fill(rng.choice(HUMANITIES_Q)),
    }
    out, seen, attempts = [], set(), 0
    while len(out) < n:
        attempts += 1
        family = rng.choice(FAMILIES)
        text = families[family]()
        if text in seen and attempts < 20 * n:
            continue
        seen.add(text)
        out.append((family, text))
    return out
