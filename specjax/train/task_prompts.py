"""Task chat prompts: work on a text or on numbers the user gives the model. Five families:
translation (into another language, or into plain English), summarization (a sentence, bullet
points, a headline, for a given audience), questions on a passage, multi-step arithmetic word
problems, and answers from given context (a few facts, a record or a small table, with a question
to be answered from it only).

Why a third generator: specjax.train.prompts and specjax.train.broad_prompts mostly ask the target
to produce something from a topic (an essay, a story, an explanation, code). Users of a chat model
also hand it a text and ask it to translate, shorten or answer questions about it, or give it a
word problem with several steps. The target's answers to those copy names, numbers and phrases
from the prompt, quote it, and follow a fixed layout (numbered steps, a final answer line, one
bullet per point), behaviour the drafter sees little of in the answers to the other generators.

Passages are consecutive paragraphs of the TinyStories train head and speeches of Tiny
Shakespeare (the shared training texts), or short documents built here from random fields (names,
towns, products, prices, dates); word problems and contexts are generated with their numbers.
Written for this project from the family names only: no evaluation file (MT-bench, the EAGLE
question sets, TinyStories dev) is read here, and a test checks that the prompts of the answer set
(task_prompts(4096)) share no 40-character stretch with an MT-bench or EAGLE question. One word
problem poses MT-bench's bus question in other words (specjax.train.evaluation_like).
"""

from __future__ import annotations

import json
import random
import re

from specjax.paths import shared_dir
from specjax.train.broad_prompts import AUDIENCES, PLACES
from specjax.train.prompts import TOPICS, _paragraphs

TASK_FAMILIES = ("translation", "summarization", "passage_qa", "word_problems", "context_qa")

MAX_CHARS = 1400  # a prompt longer than this is drawn again (~300 SmolLM2 tokens)
PASSAGE_CHARS = 1000  # passages of 1-3 paragraphs stay under this

NAMES = (
    "Alice", "Bruno", "Chen", "Divya", "Eric", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi",
    "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Victor",
    "Wen", "Yusuf", "Zoe", "Amara", "Leo", "Mia", "Noah", "Sofia", "Kenji", "Ines", "Rahul",
    "Greta", "Diego", "Aisha", "Liam", "Marta", "Olu", "Freya",
)  # fmt: skip
SURNAMES = (
    "Garcia", "Okafor", "Novak", "Tanaka", "Muller", "Rossi", "Silva", "Kowalski", "Haddad",
    "Lindqvist", "Patel", "Moreau", "Brennan", "Costa", "Ivanova", "Nguyen", "Adeyemi", "Larsen",
)  # fmt: skip
TOWNS = (
    "Millbrook", "Ashford", "Port Ellen", "Riverside", "Greenvale", "Oakridge", "Westhaven",
    "Stonebridge", "Lakeview", "Fairmont", "Brightwater", "Kingsley", "Elmstead", "Harrowgate",
)  # fmt: skip
CITIES = (
    "Paris", "Madrid", "Berlin", "Rome", "Lisbon", "Vienna", "Lyon", "Seville", "Munich",
    "Florence", "Porto", "Amsterdam", "Geneva", "Valencia",
)  # fmt: skip
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
LANGUAGES = (
    "French", "French", "Spanish", "Spanish", "German", "German", "Italian", "Portuguese",
    "Dutch", "Swedish", "Polish", "Turkish", "Japanese", "Chinese", "Korean", "Russian",
    "Arabic", "Hindi", "Indonesian", "Greek",
)  # fmt: skip
JOBS = (
    "nurse", "teacher", "bus driver", "software engineer", "baker", "architect", "pharmacist",
    "journalist", "electrician", "lawyer", "gardener", "accountant", "photographer", "chef",
)  # fmt: skip
DISHES = (
    "fish soup", "mushroom risotto", "lemon cake", "vegetable curry", "roast chicken",
    "apple pie", "lentil stew", "grilled salmon", "pumpkin ravioli", "chocolate mousse",
)  # fmt: skip
HOBBIES = (
    "Chess", "Photography", "Hiking", "Gardening", "Book", "Cycling", "Choir", "Pottery",
    "Astronomy", "Film", "Running", "Knitting",
)  # fmt: skip
# (name, lowest price, highest price) of things people buy
GOODS = (
    ("desk lamp", 15, 60), ("kettle", 20, 80), ("backpack", 25, 120), ("office chair", 60, 400),
    ("water bottle", 8, 35), ("yoga mat", 15, 60), ("toaster", 20, 90), ("umbrella", 8, 40),
    ("bike light", 10, 50), ("board game", 15, 70), ("rice cooker", 30, 150), ("blender", 25, 200),
    ("winter coat", 60, 300), ("pair of hiking boots", 70, 250), ("phone case", 5, 40),
    ("coffee grinder", 20, 180), ("tent", 60, 500), ("desk fan", 15, 70),
)  # fmt: skip
GADGETS = (
    ("noise-cancelling headphones", 80, 450), ("robot vacuum cleaner", 150, 900),
    ("smart watch", 90, 600), ("foldable electric bike", 600, 2500), ("portable speaker", 25, 300),
    ("e-reader", 70, 300), ("solar-powered backpack", 60, 250), ("smart water bottle", 25, 90),
    ("tablet", 120, 900), ("electric toothbrush", 20, 200), ("drone with a camera", 150, 1500),
)  # fmt: skip
CITIES_ANY = (  # spelled the same in English, French, Spanish, German, Italian and Portuguese
    "Paris", "Madrid", "Berlin", "Amsterdam", "Toulouse", "Bordeaux", "Hamburg", "Bilbao",
    "Oslo", "Dublin", "Toronto", "Chicago", "Boston", "Zurich",
)  # fmt: skip
VENUES = (
    "town hall", "community centre", "public library", "old school building", "parish hall",
    "back room of the Red Lion cafe", "sports centre",
)  # fmt: skip


def _join(parts) -> str:
    parts = list(parts)
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _money(x: float) -> str:
    return f"{x:.2f}" if x != int(x) else str(int(x))


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _good(rng: random.Random, items=GOODS) -> tuple[str, int]:
    """(name, price in whole dollars) of something to buy."""
    name, lo, hi = rng.choice(items)
    return name, rng.randint(lo, hi)


MOJIBAKE = (("â€œ", '"'), ("â€™", "'"), ("â€”", "—"), ("â€“", "-"), ("â€", '"'))


def _repair(text: str) -> str:
    """Undo the UTF-8-read-as-cp1252 quotes and dashes of the TinyStories file."""
    for bad, good in MOJIBAKE:
        text = text.replace(bad, good)
    return text


# ---------------------------------------------------------------------------------------------
# Passages of the shared training texts


class _Texts:
    """Story passages (runs of 1-3 consecutive TinyStories paragraphs that stay inside one story)
    and speeches (runs of Tiny Shakespeare lines), loaded once."""

    runs: list[list[str]] = []  # a paragraph and the (up to two) next ones of its story
    verses: list[str] = []  # three consecutive speeches

    @classmethod
    def load(cls) -> None:
        if cls.runs:
            return
        # Every paragraph, in file order, so that neighbours in the list are neighbours in the text.
        paras = [_repair(p) for p in _paragraphs("tinystories_train_head.txt", 1, max_words=10_000)]
        runs = []
        for i, p in enumerate(paras):
            if not 15 <= len(p.split()) <= 160:
                continue
            run = [p]
            for q in paras[i + 1 : i + 3]:
                if q.startswith(("Once upon a time", "Once there", "There once")):
                    break  # the next story
                run.append(q)
            runs.append(run)
        text = (shared_dir() / "data" / "tinyshakespeare_input.txt").read_text(encoding="utf-8")
        speeches = [s.strip() for s in text.split("\n\n") if s.strip()]
        verses = []
        for i in range(0, len(speeches) - 3, 3):
            chunk = "\n\n".join(speeches[i : i + 3])
            lines = chunk.splitlines()
            if 6 <= len(lines) <= 22 and len(chunk) <= 750:  # verse: ~1 token per 3.4 chars
                verses.append(chunk)
        cls.verses = verses
        cls.runs = runs


def _story(
    rng: random.Random, max_paras: int = 3, budget: int = PASSAGE_CHARS, min_words: int = 40
) -> str:
    """1..max_paras consecutive paragraphs of one story, under `budget` characters and, where the
    story allows, at least `min_words` words."""
    run = rng.choice(_Texts.runs)
    sizes = [len("\n\n".join(run[:k])) for k in range(1, len(run) + 1)]
    words = [len(" ".join(run[:k]).split()) for k in range(1, len(run) + 1)]
    top = max([k for k in range(1, min(max_paras, len(run)) + 1) if sizes[k - 1] <= budget] or [1])
    low = min([k for k in range(1, top + 1) if words[k - 1] >= min_words] or [top])
    text = "\n\n".join(run[: rng.randint(low, top)])
    if len(text) > budget:  # a single long paragraph: cut at a sentence end
        cut = text[:budget].rfind(". ")
        text = text[: cut + 1] if cut > 200 else text[:budget]
    return text


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])", " ".join(text.split())) if s]


def _story_names(text: str) -> list[str]:
    """Characters' names in a story passage ("a girl named Lily"), else capitalised words that
    are not at the start of a sentence."""
    named = re.findall(r"named ([A-Z][a-z]+)", text)
    if named:
        return list(dict.fromkeys(named))
    words = text.split()
    found = []
    for prev, raw in zip(words, words[1:], strict=False):
        w = raw.rstrip(".,!?;:\"'")
        if re.fullmatch(r"[A-Z][a-z]+", w) and not re.search(r"[.!?\"]$", prev):
            found.append(w)
    return [w for w in dict.fromkeys(found) if found.count(w) >= 2 and w not in NOT_NAMES]


NOT_NAMES = ("The", "They", "He", "She", "It", "But", "Then", "When", "One", "Mom", "Dad", "Mum")


def _verse_speakers(text: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"^([A-Z][A-Za-z ]+):$", text, flags=re.M)))


def _speech(rng: random.Random) -> str:
    """One speech of 2-8 lines (with its speaker), else a whole three-speech passage."""
    verse = rng.choice(_Texts.verses)
    speeches = [sp for sp in verse.split("\n\n") if 3 <= len(sp.splitlines()) <= 9]
    return rng.choice(speeches) if speeches else verse


def _verse_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.endswith(":")]


# ---------------------------------------------------------------------------------------------
# Generated documents: (text, questions that the text answers)


def _news(rng: random.Random) -> tuple[str, list[str]]:
    town, name, name2 = rng.choice(TOWNS), rng.choice(NAMES), rng.choice(SURNAMES)
    event = rng.choice(
        ("food festival", "book fair", "summer market", "music festival", "kite festival",
         "charity run", "flower show", "science fair", "street parade", "cheese fair")
    )  # fmt: skip
    day, month = rng.choice(DAYS), rng.choice(MONTHS)
    visitors = rng.randrange(800, 20000, 50)
    stalls, gap = rng.randint(12, 140), rng.randint(2, 6)
    price = rng.choice((3, 4, 5, 6, 8, 10, 12))
    raised = rng.randrange(1000, 40000, 250)
    cause = rng.choice(
        ("the children's hospital", "a new playground", "the local food bank",
         "repairs to the old bridge", "the animal shelter", "the town's flood defences")
    )  # fmt: skip
    sentences = [
        f"The {town} {event} returned on {day} after a break of {gap} years.",
        f"Organiser {name} {name2} said that about {visitors} people came, far more than expected.",
        f"There were {stalls} stalls, and tickets cost {price} dollars for adults, with children "
        "going free.",
        f"The event raised {raised} dollars for {cause}.",
        rng.choice(
            (
                "Heavy rain in the afternoon sent many visitors into the covered hall.",
                "A power cut stopped the music for almost an hour.",
                "The car park was full by ten o'clock, and the council added extra buses.",
                "Several stall holders sold out before lunch.",
            )
        ),
        f"Next year the {event} will move to {rng.choice([m for m in MONTHS if m != month])} to "
        "avoid the school holidays.",
    ]
    questions = [
        f"When did the {event} take place?",
        "How many people came?",
        f"Who organised the {event}?",
        "How much did an adult ticket cost?",
        "How much money was raised, and for what?",
        "What will change next year?",
        "How much would a family of two adults and three children pay to get in?",
        "What went wrong, or what surprised the organisers?",
    ]
    if rng.random() < 0.5:
        sentences.insert(1, f"It was held in {month} for the first time.")
        questions.append("In which month was it held?")
    return " ".join(sentences), questions


def _email(rng: random.Random) -> tuple[str, list[str]]:
    sender, to, other = rng.sample(NAMES, 3)
    topic = rng.choice(
        ("website redesign", "spring newsletter", "office move", "customer survey", "charity gala",
         "new warehouse", "summer campaign", "training programme", "annual report", "staff app",
         "product launch", "recycling scheme", "library extension", "volunteer fair")
    )  # fmt: skip
    day, day2 = rng.sample(DAYS[:5], 2)
    hh, room, budget = rng.randint(9, 16), rng.randint(100, 450), rng.randrange(2, 90)
    lines = [
        f"Subject: {rng.choice(('Update on', 'Next steps for', 'Plans for', 'Questions about'))} "
        f"the {topic} project",
        "",
        f"Hi {to},",
        "",
        f"Thanks for your notes from last week. The review meeting has moved from {day} to {day2} "
        f"at {hh}:00 in room {room}, because {other} is away until then.",
        f"Before the meeting, could you send me the updated budget? We have {budget}k dollars "
        f"left, and {rng.choice(('the printing', 'travel', 'the new laptops', 'the venue'))} will "
        f"take about {rng.randint(10, 60)}% of it.",
        rng.choice(
            (
                f"{other} also asked whether we can push the deadline back by a week; I said I "
                "would check with you first.",
                "I have booked the projector, but we still need someone to take notes.",
                "The client liked the first draft but wants a shorter summary at the start.",
            )
        ),
        "",
        rng.choice(("Best wishes,", "Thanks,", "Cheers,", "Kind regards,")),
        sender,
    ]
    questions = [
        "Who wrote the email, and to whom?",
        "When and where is the meeting now?",
        "Why was the meeting moved?",
        "What does the sender ask the reader to do?",
        "How much of the budget is left?",
        "What is the email mainly about?",
    ]
    return "\n".join(lines), questions


def _review(rng: random.Random) -> tuple[str, list[str]]:
    (product, price), name = _good(rng, GADGETS), rng.choice(NAMES)
    product = _a(product) if product[-1] != "s" else product
    stars, weeks = rng.randint(1, 5), rng.randint(1, 12)
    good = rng.sample(
        ("it is well made", "the battery lasts for days", "it was easy to set up",
         "it looks great", "customer service answered within an hour", "it is very light",
         "the instructions are clear", "it is quieter than I expected"), 2,
    )  # fmt: skip
    bad = rng.sample(
        ("it is overpriced", "the app keeps crashing", "delivery took three weeks",
         "the colour faded quickly", "it is heavier than advertised", "one part broke",
         "the charger is too short", "the manual is confusing"), 2,
    )  # fmt: skip
    text = (
        f"Review by {name}, {stars} out of 5 stars. I bought {product} {weeks} weeks ago for "
        f"{price} dollars. On the plus side, {good[0]}, and {good[1]}. However, {bad[0]}, and "
        f"{bad[1]}. "
        + rng.choice(
            (
                "Overall I would buy it again, but only on sale.",
                "I am returning it and getting my money back.",
                "I would recommend it to a friend with a few warnings.",
                "For the price, it is hard to beat.",
            )
        )
    )
    questions = [
        "What did the reviewer buy, and how much did it cost?",
        "What does the reviewer like about it?",
        "What are the reviewer's complaints?",
        "How many stars did the reviewer give?",
        "Would the reviewer recommend it? Explain.",
        "How long has the reviewer had the product?",
    ]
    return text, questions


def _biography(rng: random.Random) -> tuple[str, list[str]]:
    first, last = rng.choice(NAMES), rng.choice(SURNAMES)
    born, town, job = rng.randint(1930, 1995), rng.choice(TOWNS), rng.choice(JOBS)
    city, age = rng.choice(CITIES), rng.randint(18, 30)
    work_years, books = rng.randint(5, 30), rng.randint(1, 6)
    hobby = rng.choice(
        ("chess", "photography", "hiking", "gardening", "cycling", "pottery", "astronomy",
         "running", "knitting", "birdwatching", "painting")
    )  # fmt: skip
    sentences = [
        f"{first} {last} was born in {town} in {born}.",
        f"At {age}, {first} moved to {city} to train as {_a(job)}.",
        f"{first} worked there for {work_years} years before returning home.",
        f"Later, {first} wrote {books} book{'s' * (books > 1)} about {rng.choice(TOPICS)}.",
        f"In their free time, {first} loves {hobby} and runs a small {hobby} group at the "
        f"{rng.choice(VENUES)}.",
        rng.choice(
            (
                f"{first} has {rng.randint(2, 5)} grandchildren and a very old dog.",
                f"In {born + age + work_years + rng.randint(1, 5)}, {first} received a prize "
                "from the town for volunteering.",
                f"{first} still cooks the dishes learned during the years in {city}.",
            )
        ),
    ]
    questions = [
        f"Where and when was {first} born?",
        f"Why did {first} move to {city}?",
        f"How old was {first} when leaving {city}?",
        f"What has {first} written?",
        f"What does {first} do in their free time?",
        f"In which year did {first} move to {city}?",
    ]
    return " ".join(sentences), questions


def _notice(rng: random.Random) -> tuple[str, list[str]]:
    place = rng.choice(("library", "swimming pool", "museum", "sports centre", "town hall"))
    town, day, month = rng.choice(TOWNS), rng.choice(DAYS), rng.choice(MONTHS)
    weeks, hh, fee = rng.randint(2, 10), rng.randint(8, 10), rng.randint(2, 15)
    text = (
        f"Notice to all visitors of the {town} {place}. From 1 {month}, the {place} will be "
        f"closed for {weeks} weeks while the {rng.choice(('roof', 'heating', 'lifts'))} "
        f"{rng.choice(('is repaired', 'is replaced', 'is made safe'))}. During this time, a "
        f"temporary service will run every {day} from {hh}:00 to {hh + 4}:00 in the "
        f"{rng.choice(VENUES)}. Season tickets will be extended by {weeks} weeks at no cost. "
        f"Late fees and booking charges of {fee} dollars or less will be waived. "
        f"For questions, call {rng.randint(200, 999)} {rng.randint(1000, 9999)} or ask at the "
        "front desk."
    )
    questions = [
        f"When does the {place} close, and for how long?",
        "Why is it closing?",
        "Where and when will the temporary service run?",
        "What happens to season tickets?",
        "How can visitors ask questions?",
        "Which charges are waived?",
    ]
    return text, questions


def _travel(rng: random.Random) -> tuple[str, list[str]]:
    place, name = rng.choice(PLACES), rng.choice(NAMES)
    days, km, cost = rng.randint(3, 14), rng.randint(20, 180), rng.randrange(300, 4000, 50)
    best = rng.choice(
        ("a sunrise walk", "a cooking class", "a boat trip", "a night market",
         "a museum about local history", "a long swim in a cold lake")
    )  # fmt: skip
    worst = rng.choice(
        ("a lost suitcase", "a cancelled train", "a sunburn on the first day",
         "a hotel room next to a noisy bar", "a week of rain")
    )  # fmt: skip
    text = (
        f"{name}'s travel diary: I spent {days} days in {place} and walked about {km} kilometres "
        f"in total. The whole trip cost {cost} dollars, including flights. The highlight was "
        f"{best}; the low point was {worst}. The locals were friendly and patient with my "
        f"terrible attempts at the language. "
        + rng.choice(
            (
                "Next time I will pack lighter and stay longer.",
                "I would go back tomorrow if I could.",
                "It was tiring, but worth every cent.",
            )
        )
    )
    questions = [
        f"How long was the trip to {place}?",
        "What was the best part of the trip, and what was the worst?",
        "How much did the trip cost per day, roughly?",
        "How far did the writer walk on average each day?",
        "How did the writer feel about the locals?",
        "Would the writer go back? How do you know?",
    ]
    return text, questions


DOCUMENTS = (_news, _email, _review, _biography, _notice, _travel)


def _passage(rng: random.Random) -> tuple[str, str, list[str]]:
    """(kind, text, questions) with kind 'story', 'verse' or 'document'."""
    r = rng.random()
    if r < 0.45:
        text = _story(rng)
        return "story", text, _story_questions(rng, text)
    if r < 0.6:
        text = rng.choice(_Texts.verses)
        return "verse", text, _verse_questions(rng, text)
    text, questions = rng.choice(DOCUMENTS)(rng)
    return "document", text, questions


def _story_questions(rng: random.Random, text: str) -> list[str]:
    questions = [
        "Who is the main character?",
        "Where does the story take place?",
        "What problem comes up, and how is it solved?",
        "How does the passage end?",
        "What lesson could a reader learn from this passage?",
        "How do the characters feel at the beginning, and how do they feel at the end?",
        "What happens first, and what happens after that?",
        "Find a word in the passage that describes a feeling and explain what it means.",
        "Suggest a good title for this passage and explain your choice.",
        "Which sentence shows the turning point of the passage?",
        "What do you think happens next?",
    ]
    for name in _story_names(text)[:2]:
        questions += [
            f"What does {name} want?",
            f"Why does {name} act the way they do?",
            f"Describe {name} in three words, using details from the text.",
            f"How does {name} change from the start to the end?",
        ]
    sents = [s for s in _sentences(text) if 30 <= len(s) <= 140]
    if sents:
        s = rng.choice(sents)
        questions.append(f'Why is this sentence important: "{s}"')
    return questions


def _verse_questions(rng: random.Random, text: str) -> list[str]:
    questions = [
        "Who is speaking in this passage, and what do they want?",
        "What is the mood of this scene?",
        "What is the disagreement or problem in this exchange?",
        "Retell what happens here in modern English.",
        "How would you describe the relationship between the speakers?",
    ]
    for speaker in _verse_speakers(text)[:2]:
        questions.append(f"What is {speaker.title()} trying to say?")
    lines = [ln for ln in _verse_lines(text) if 20 <= len(ln) <= 90 and ln[0].isupper()]
    if lines:
        questions.append(f'What does the line "{rng.choice(lines).strip()}" mean?')
    return questions


# ---------------------------------------------------------------------------------------------
# 1. Translation

EVERYDAY = (
    "The train to {city} leaves at {hh}:{mm} from platform {k}.",
    "{name} bought {k} kilos of apples at the market for {p} euros.",
    "Could you tell me where the nearest pharmacy is?",
    "My sister works as {job} in {city} and visits us every {month}.",
    "The museum is closed on {day}s, but the garden stays open until {hh} o'clock.",
    "Please send me the report about {topic} before {day}.",
    "We would like a room for {k} nights, from {day} to {day2}.",
    "I have been learning to cook for {k} months, and my favourite dish is {dish}.",
    "The meeting has been moved to {day} at {hh}:00 because {name} is ill.",
    "Don't forget to water the plants and feed the cat while I am in {city}.",
    "{name} has lived in {city} for {k} years and still gets lost in the old town.",
    "Our flight was delayed by {k} hours, so we missed the last bus to the hotel.",
    "Thank you for the lovely dinner; the {dish} was delicious.",
    "The bakery on the corner sells fresh bread every morning from seven o'clock.",
    "How much does a ticket to {city} cost, and is breakfast included?",
    "It is going to rain tomorrow, so take an umbrella to school.",
    "Hi {name}, I'm running {k} minutes late. Start without me and save me a seat!",
    "Excuse me, is this seat free?",
    "I am allergic to nuts. Does this {dish} contain any?",
    "The doctor said I should rest for {k} days and drink plenty of water.",
    "Happy birthday, {name}! I hope all your wishes come true this year.",
    "Our new office is on the {k}th floor, next to the lifts.",
    "Can we pay by card, or do you only take cash?",
    "The children played in the park until it got dark.",
    "I forgot my keys at home, so I had to wait for {name} outside.",
    "The concert starts at {hh} o'clock, but the doors open an hour earlier.",
    "{name} is a great colleague and the most patient person I know.",
    "Turn left at the second traffic light, and the hotel is on your right.",
    "We are out of milk; could you buy some on your way home?",
    "The shop will be closed from {day} until the end of {month} for repairs.",
    "Learning about {topic} changed the way I think about my own life.",
    "This {product} is light, easy to use and comes with a two-year guarantee.",
)
FOREIGN = (
    ("French", "Le train pour {cityx} part à {hh} heures."),
    ("French", "Je voudrais réserver une table pour {k} personnes ce soir."),
    ("French", "{name} habite à {cityx} depuis {k} ans."),
    ("French", "Pouvez-vous m'aider à trouver la gare, s'il vous plaît ?"),
    ("French", "Il fait beau aujourd'hui, alors nous allons pique-niquer au parc."),
    ("French", "Mon frère travaille dans une boulangerie et se lève très tôt le matin."),
    ("Spanish", "Mañana vamos a visitar a mis abuelos en {cityx}."),
    ("Spanish", "¿Cuánto cuesta este libro?"),
    ("Spanish", "{name} trabaja en un hospital y empieza a las {hm} de la mañana."),
    ("Spanish", "Necesito comprar {k} kilos de tomates para la cena."),
    ("Spanish", "Cuando era niño, pasaba los veranos en la casa de mi tía."),
    ("German", "Ich habe {k} Jahre in {cityx} gewohnt."),
    ("German", "Kannst du mir bitte das Salz geben?"),
    ("German", "Der Zug nach {cityx} hat {k} Minuten Verspätung."),
    ("German", "Am Wochenende gehen wir oft im Wald spazieren."),
    ("German", "{name} hat heute Geburtstag, und wir backen einen Kuchen."),
    ("Italian", "La biblioteca apre alle nove e chiude alle sei."),
    ("Italian", "{name} ha comprato {k} libri al mercato."),
    ("Italian", "Scusi, dov'è la fermata dell'autobus?"),
    ("Portuguese", "Nós vamos à praia no sábado se não chover."),
    ("Portuguese", "{name} mora em {cityx} e trabalha num restaurante."),
)
FORMAL = (
    "Pursuant to the revised policy, all employees are required to submit expense claims within "
    "{k} business days of incurring the expenditure. Claims received after this period shall not "
    "be reimbursed, save in exceptional circumstances approved in writing by a line manager.",
    "The tenant shall not sublet the premises or any part thereof without the prior written "
    "consent of the landlord, such consent not to be unreasonably withheld. Any breach of this "
    "clause may result in the termination of the agreement with {k} days' notice.",
    "Patients are advised to refrain from consuming food or beverages for a minimum of {k} hours "
    "prior to the procedure, with the exception of small quantities of water.",
    "In the event of a fire alarm, occupants must evacuate the building via the nearest available "
    "exit and proceed to the designated assembly point. The use of lifts is strictly prohibited.",
    "The council wishes to inform residents that, owing to necessary maintenance works, refuse "
    "collection on {day} will be postponed by {k} days. Residents are kindly requested to retain "
    "their waste until the rescheduled date.",
    "Subscribers may terminate the service at any time; however, fees already paid for the current "
    "billing period are non-refundable, and termination shall take effect at its conclusion.",
    "Applicants must furnish proof of residence dated within the preceding {k} months, together "
    "with a valid form of photographic identification, in order for the application to proceed.",
    "The warranty does not extend to damage arising from misuse, unauthorised modification or "
    "failure to adhere to the maintenance schedule set out in section {k} of this manual.",
)
TRANSLATE = (
    "Translate into {lang}:\n\n{text}",
    "Translate the following text into {lang}.\n\n{text}",
    'How would you say this in {lang}? "{text}"',
    "Please translate this message into {lang}, keeping the tone friendly:\n\n{text}",
    "Translate the text below into {lang}. Then list three useful words from it with their "
    "meanings.\n\n{text}",
    "Give a {lang} translation of the following: first a word-for-word one, then a natural "
    "one.\n\n{text}",
    "I need this in {lang} for a colleague. Translate it and keep the names unchanged:\n\n{text}",
    "Translate into {lang} and into {lang2}:\n\n{text}",
    "{text}\n\nTranslate the text above into {lang}.",
    "Can you put this into {lang}? Use a formal register.\n\n{text}",
    "Translate to {lang}, and explain any part that is hard to translate:\n\n{text}",
    "{lang} translation, please:\n{text}",
)
TRANSLATE_SHORT = (
    "Translate this sentence into {lang} and explain the grammar of its main verb: {text}",
    'What is the {lang} for "{text}"?',
    "Give three ways to say this in {lang}, from casual to formal: {text}",
)
FROM_FOREIGN = (
    "Translate this {src} sentence into English: {text}",
    'What does this mean in English? "{text}"',
    "Translate from {src} to English and explain the words a beginner might not know:\n\n{text}",
    "Translate into English, then into {lang}:\n\n{text}",
    'I got this message in {src}: "{text}" What does it say?',
)
PLAIN_ENGLISH = (
    "Rewrite the following in plain, simple English that {audience} could understand:\n\n{text}",
    "Translate this into everyday English:\n\n{text}",
    "Put this into plain English in no more than {k} sentences:\n\n{text}",
    "What does this actually mean? Explain it in simple words.\n\n{text}",
    "{text}\n\nRewrite the text above in plain English without leaving out any fact.",
)
SHAKESPEARE_TO = (
    "Translate this passage into modern English:\n\n{text}",
    "Rewrite these lines in plain modern English, speaker by speaker:\n\n{text}",
    "Put this scene into simple English that {audience} could follow:\n\n{text}",
    "Translate this into {lang}, in modern language rather than old-fashioned style:\n\n{text}",
)


def _fill_everyday(rng: random.Random, template: str) -> str:
    day, day2 = rng.sample(DAYS, 2)
    return template.format(
        city=rng.choice(CITIES),
        hh=rng.randint(6, 22),
        mm=f"{rng.choice((0, 5, 15, 20, 30, 40, 45, 55)):02d}",
        k=rng.randint(2, 12),
        p=rng.randint(2, 30),
        name=rng.choice(NAMES),
        job=_a(rng.choice(JOBS)),
        month=rng.choice(MONTHS),
        day=day,
        day2=day2,
        topic=rng.choice(TOPICS),
        dish=rng.choice(DISHES),
        product=_good(rng)[0],
        cityx=rng.choice(CITIES_ANY),
        hm=rng.randint(6, 11),
    )


def _translation(rng: random.Random) -> str:
    lang = rng.choice(LANGUAGES)  # weighted towards French, Spanish and German
    lang2 = rng.choice([x for x in sorted(set(LANGUAGES)) if x != lang])
    r = rng.random()
    if r < 0.35:  # everyday sentences
        k = rng.choice((1, 1, 1, 2, 3, 4))
        text = " ".join(_fill_everyday(rng, t) for t in rng.sample(EVERYDAY, k))
        templates = TRANSLATE + TRANSLATE_SHORT if k == 1 else TRANSLATE
        return rng.choice(templates).format(lang=lang, lang2=lang2, text=text)
    if r < 0.6:  # a story passage: a few sentences or one or two paragraphs
        if rng.random() < 0.5:
            sents = _sentences(_story(rng, max_paras=1, min_words=0))
            start = rng.randrange(max(1, len(sents) - 2))
            text = " ".join(sents[start : start + rng.randint(1, 4)])
        else:
            text = _story(rng, max_paras=2, budget=700)
        templates = TRANSLATE if "\n" not in text else [t for t in TRANSLATE if '"' not in t]
        return rng.choice(templates).format(lang=lang, lang2=lang2, text=text)
    if r < 0.72:  # into English from another language
        src, template = rng.choice(FOREIGN)
        text = _fill_everyday(rng, template)
        return rng.choice(FROM_FOREIGN).format(src=src, lang=lang, text=text)
    if r < 0.86:  # formal text into plain English
        text = rng.choice(FORMAL).format(k=rng.randint(2, 30), day=rng.choice(DAYS))
        return rng.choice(PLAIN_ENGLISH).format(
            audience=rng.choice(AUDIENCES), k=rng.randint(2, 4), text=text
        )
    verse = _speech(rng) if rng.random() < 0.6 else rng.choice(_Texts.verses)
    return rng.choice(SHAKESPEARE_TO).format(lang=lang, audience=rng.choice(AUDIENCES), text=verse)


# ---------------------------------------------------------------------------------------------
# 2. Summarization

SUMMARIZE = (
    "Summarize the following passage in one sentence.\n\n{text}",
    "Summarize this in {k} bullet points:\n\n{text}",
    "Write a headline for this text.\n\n{text}",
    "Give me a short summary of the text below for {audience}.\n\n{text}",
    "{text}\n\nSummarize the passage above in no more than {w} words.",
    "TL;DR of the following, please:\n\n{text}",
    "Read the text and write a two-sentence summary, then a headline.\n\n{text}",
    "List the main events of this text in order, as a numbered list.\n\n{text}",
    "Condense this into a single social media post of under 280 characters.\n\n{text}",
    "Write a summary of the text below that keeps every name and number.\n\n{text}",
    "What is the gist of this passage? Answer in {k} sentences.\n\n{text}",
    "Summarize the following for {audience}, in {tone}.\n\n{text}",
    "Here is a text:\n\n{text}\n\nWrite a one-paragraph summary, then state the main idea in "
    "five words.",
    "Text:\n{text}\n\nTask: summarize it in {w} words or fewer, then give three keywords.",
    "Can you sum this up for me? I only have a minute.\n\n{text}",
    "Summarize this {kind} as three bullet points: who, what, and why it matters.\n\n{text}",
    "{text}\n\nGive a one-line summary and a longer summary of about {w} words.",
)
TONES = ("a friendly tone", "a formal tone", "plain words", "a neutral, factual tone")


def _summarization(rng: random.Random) -> str:
    kind, text, _ = _passage(rng)
    noun = {"story": "story", "verse": "scene", "document": "text"}[kind]
    return rng.choice(SUMMARIZE).format(
        text=text,
        k=rng.randint(2, 5),
        w=rng.choice((15, 20, 25, 30, 40, 50, 60)),
        audience=rng.choice(AUDIENCES),
        tone=rng.choice(TONES),
        kind=noun,
    )


# ---------------------------------------------------------------------------------------------
# 3. Questions on a passage

QA_ONE = (
    "{text}\n\nQuestion: {q}",
    "Read the passage and answer the question.\n\n{text}\n\n{q}",
    "Based on the text below, answer this: {q}\n\n{text}",
    "Passage:\n{text}\n\nQ: {q}\nA:",
    "{text}\n\n{q} {style}",
    "Here is a short text.\n\n{text}\n\nUsing the text, answer: {q} {style}",
)
QA_MANY = (
    "Read the passage and answer the questions.\n\n{text}\n\n{qs}",
    "{text}\n\nAnswer the following questions about the passage. {style}\n{qs}",
    "Passage:\n{text}\n\nQuestions:\n{qs}",
    "I am checking my reading comprehension. Here is the text:\n\n{text}\n\nPlease answer:\n{qs}",
    "{text}\n\n{qs}\n\n{style}",
)
QA_STYLES = (
    "Answer briefly.",
    "Answer in full sentences.",
    "Quote the sentence that supports each answer.",
    "Keep each answer to one sentence.",
    "Explain your reasoning.",
    "",
)


def _passage_qa(rng: random.Random) -> str:
    _, text, questions = _passage(rng)
    style = rng.choice(QA_STYLES)
    k = rng.choice((1, 1, 2, 3, 4))
    qs = rng.sample(questions, min(k, len(questions)))
    if len(qs) == 1:
        return rng.choice(QA_ONE).format(text=text, q=qs[0], style=style).strip()
    bullet = rng.choice(("num", "dash", "plain"))
    if bullet == "num":
        block = "\n".join(f"{i + 1}. {q}" for i, q in enumerate(qs))
    elif bullet == "dash":
        block = "\n".join(f"- {q}" for q in qs)
    else:
        block = "\n".join(qs)
    return rng.choice(QA_MANY).format(text=text, qs=block, style=style).strip()


# ---------------------------------------------------------------------------------------------
# 4. Multi-step arithmetic word problems


def _wp_shopping(rng, a):
    (i1, p1), (i2, p2) = rng.sample(
        (("notebooks", 3), ("pens", 2), ("sandwiches", 5), ("bottles of juice", 2),
         ("packets of seeds", 4), ("candles", 6), ("comic books", 7), ("bags of rice", 9),
         ("tins of paint", 12), ("plant pots", 8)), 2,
    )  # fmt: skip
    p1, p2 = p1 + rng.choice((0, 0.5, 1, 2)), p2 + rng.choice((0, 0.25, 0.5, 1))
    x, y = rng.randint(2, 9), rng.randint(2, 9)
    total = x * p1 + y * p2
    coupon = rng.choice((0, 0, 2, 3, 5))
    bill = next(b for b in (10, 20, 50, 100, 200, 500) if b > total)
    text = f"{a} buys {x} {i1} at {_money(p1)} dollars each and {y} {i2} at {_money(p2)} dollars"
    text += " each."
    if coupon and total > coupon + 5:
        text += f" A coupon takes {coupon} dollars off the total."
    return text + f" {a} pays with a {bill}-dollar note. How much change should {a} get?"


def _wp_savings(rng, a):
    start, weekly, weeks = rng.randrange(10, 200, 5), rng.randrange(5, 40, 5), rng.randint(3, 12)
    spend = rng.randrange(10, start + weekly * weeks, 5)
    thing = rng.choice(("a bike helmet", "concert tickets", "a birthday present", "new shoes",
                        "a video game", "a train pass"))  # fmt: skip
    text = (
        f"{a} has {start} dollars saved and adds {weekly} dollars every week. After {weeks} "
        f"weeks, {a} spends {spend} dollars on {thing}. How much money does {a} have then?"
    )
    if rng.random() < 0.5:
        left = start + weekly * weeks - spend
        goal = left + weekly * rng.randint(2, 10)
        text += f" How many more weeks of saving until {a} has {goal} dollars?"
    return text


def _wp_baking(rng, a):
    food = rng.choice(("cookies", "muffins", "cupcakes", "bread rolls", "pancakes"))
    while True:
        trays, per, spoiled, friends = (
            rng.randint(2, 6), rng.randint(6, 24), rng.randint(1, 9), rng.randint(2, 8)
        )  # fmt: skip
        if (trays * per - spoiled) % friends == 0 and trays * per > spoiled:
            break
    lost = rng.choice(("burn", "fall on the floor", "are eaten by the dog", "are too small"))
    return (
        f"{a} bakes {trays} trays of {food} with {per} on each tray. {spoiled} of them {lost}. "
        f"The rest are shared equally among {friends} friends. How many {food} does each friend "
        "get?"
    )


def _wp_travel(rng, a):
    vehicle = rng.choice(("car", "train", "coach", "motorbike", "bicycle"))
    if vehicle == "bicycle":
        v1, v2 = rng.randint(12, 25), rng.randint(12, 25)
    else:
        v1, v2 = rng.randrange(40, 130, 5), rng.randrange(40, 130, 5)
    h1, h2 = rng.randint(1, 4), rng.randint(1, 3)
    who = rng.choice((f"A {vehicle}", f"{a}'s {vehicle}"))
    text = (
        f"{who} travels at {v1} km/h for {h1} hours, stops for a break, then travels at {v2} km/h "
        f"for {h2} more hours. How far does it go in total?"
    )
    r = rng.random()
    if r < 0.4:
        text += " What is its average speed while moving? Round to one decimal place if needed."
    elif r < 0.7:
        route = v1 * h1 + v2 * h2 + rng.randrange(10, 200, 10)
        text += f" If the whole route is {route} km, how much further is there to go?"
    return text


def _wp_reading(rng, a):
    r1, d1, r2, d2 = rng.randint(8, 40), rng.randint(2, 7), rng.randint(10, 50), rng.randint(2, 8)
    pages = r1 * d1 + r2 * d2
    return (
        f"A book has {pages} pages. {a} reads {r1} pages a day for the first {d1} days, then "
        f"{r2} pages a day after that. How many days does it take {a} to finish the book?"
    )


def _wp_wages(rng, a):
    rate, hours, sat = rng.randrange(12, 40, 2), rng.randint(4, 9), rng.randint(2, 6)
    extra = rng.choice((1.5, 2))
    text = (
        f"{a} earns {rate} dollars an hour. From Monday to Friday {a} works {hours} hours a day, "
        f"and on Saturday {a} works {sat} hours at {extra:g} times the normal rate. How much does "
        f"{a} earn in one week?"
    )
    if rng.random() < 0.5:
        text += f" If {rng.choice((10, 20, 25))}% is taken in tax, how much is left?"
    return text


def _wp_tickets(rng, a):
    adults, kids = rng.randint(30, 300), rng.randint(20, 250)
    pa, pc = rng.randint(6, 20), rng.randint(2, 8)
    cost = rng.randrange(100, 1500, 25)
    event = rng.choice(("school play", "charity concert", "puppet show", "talent show"))
    text = (
        f"{a} helped to organise a {event}. It sold {adults} adult tickets at {pa} dollars and "
        f"{kids} child tickets at {pc} dollars. Costumes, lights and the hall cost {cost} dollars "
        "in total. How much profit did it make?"
    )
    if rng.random() < 0.4:
        text += f" The profit is shared equally between {rng.randint(2, 5)} local charities. How "
        text += "much does each charity get?"
    return text


def _wp_garden(rng, a):
    rows, per = rng.randint(3, 12), rng.randrange(4, 20, 2)
    pct = rng.choice((10, 20, 25, 50))
    while rows * per * pct % 100:
        rows += 1
    plant, fruit = rng.choice(
        (("tomato plant", "tomatoes"), ("pepper plant", "peppers"), ("bean plant", "pods"),
         ("strawberry plant", "strawberries"), ("apple tree", "apples"))
    )  # fmt: skip
    each = rng.randint(3, 30)
    text = (
        f"{a} plants {rows} rows of {per} {plant}s each. {pct}% of them do not survive the "
        f"first frost. Each remaining {plant} gives {each} {fruit}. How many {fruit} are "
        "harvested?"
    )
    if rng.random() < 0.4:
        text += f" {a} sells them in boxes of {rng.choice((6, 10, 12, 20))}. How many full boxes "
        text += "can be filled?"
    return text


def _wp_discount(rng, a):
    item, price = _good(rng, GOODS + GADGETS)
    price = max(20, round(price / 20) * 20)
    d, off = rng.choice((10, 15, 20, 25, 30)), rng.randrange(5, max(10, price // 2), 5)
    return (
        f"{a} wants to buy {_a(item)}, which costs {price} dollars. Shop A offers {d}% off. Shop B "
        f"offers {off} dollars off but charges {rng.randint(3, 15)} dollars for delivery. Which "
        "shop is cheaper, and by how much?"
    )


def _wp_ages(rng, a):
    b, c = rng.sample([n for n in NAMES if n != a], 2)
    young, times = rng.randint(3, 15), rng.randint(2, 4)
    diff, years = rng.randint(1, 9), rng.randint(2, 10)
    return (
        f"{b} is {young} years old. {a} is {times} times as old as {b}, and {c} is {diff} years "
        f"younger than {a}. What will the sum of their three ages be in {years} years?"
    )


def _wp_tank(rng, a):
    frac, word = rng.choice(((4, "a quarter"), (2, "half"), (4, "three quarters"), (5, "a fifth")))
    num = 3 if word == "three quarters" else 1
    while True:
        cap = rng.randrange(100, 2000, 20)
        if cap % frac == 0:
            empty = cap - cap * num // frac
            rates = [r for r in range(5, 60) if empty % r == 0]
            if rates:
                break
    rate = rng.choice(rates)
    what = rng.choice(("water tank", "rain barrel", "swimming pool", "fish tank", "fuel tank"))
    return (
        f"A {what} holds {cap} litres and is {word} full. A pump adds {rate} litres per minute. "
        f"How many minutes until the {what} is full? {a} starts the pump at "
        f"{rng.randint(7, 11)}:{rng.choice(('00', '15', '30', '45'))}; when will it be full?"
    )


def _wp_recipe(rng, a):
    serves = rng.choice((2, 4, 6))
    want = serves * rng.choice((2, 3)) if rng.random() < 0.6 else serves // 2 * rng.choice((3, 5))
    flour, eggs = rng.randrange(100, 600, 50), rng.randint(1, 4)
    bag = rng.choice((500, 1000))
    eggs = f"{eggs} egg" + "s" * (eggs > 1)
    text = (
        f"A recipe for {serves} people needs {flour} grams of flour and {eggs}. {a} is "
        f"cooking for {want} people. How much flour and how many eggs are needed?"
    )
    if rng.random() < 0.5:
        text += f" Flour is sold in {bag}-gram bags. How many bags must {a} buy?"
    return text


def _wp_bus(rng, a):
    vehicle = rng.choice(("bus", "tram", "ferry"))
    people = rng.randint(10, 45)
    text = f"{a} is driving a {vehicle} that starts with {people} passengers."
    ordinal = ("first", "second", "third", "fourth")
    for i in range(rng.randint(2, 4)):
        off, on = rng.randint(0, min(people, 12)), rng.randint(0, 15)
        people += on - off
        off_text = {0: "nobody gets off", 1: "1 person gets off"}.get(off, f"{off} get off")
        on_text = {0: "nobody gets on", 1: "1 person gets on"}.get(on, f"{on} get on")
        text += f" At the {ordinal[i]} stop, {off_text} and {on_text}."
    return text + f" How many passengers are on the {vehicle} after the last stop?"


def _wp_fuel(rng, a):
    use = rng.choice((5, 6, 7, 8, 9, 10))
    dist = rng.randrange(100, 1200, 50)
    price = rng.choice((1.5, 1.6, 1.75, 1.8, 2.0))
    people = rng.randint(2, 5)
    text = (
        f"{a}'s car uses {use} litres of fuel per 100 km. The trip to {rng.choice(PLACES)} and "
        f"back is {dist} km in total, and fuel costs {price:.2f} dollars per litre. How much "
        "will the fuel cost?"
    )
    if rng.random() < 0.5:
        text += f" If {people} friends share the cost equally, how much does each pay?"
    return text


def _wp_schedule(rng, a):
    h, m = rng.randint(7, 10), rng.choice((0, 10, 15, 30, 45))
    tasks, mins, brk = rng.randint(3, 6), rng.randrange(15, 70, 5), rng.choice((10, 15, 20, 30))
    return (
        f"{a} starts work at {h}:{m:02d}. There are {tasks} tasks that take {mins} minutes each, "
        f"with one {brk}-minute break in the middle. At what time does {a} finish?"
    )


def _wp_packing(rng, a):
    items = rng.randint(40, 500)
    box = rng.choice((6, 8, 10, 12, 15, 24))
    cost = rng.choice((0.5, 0.75, 1.25, 1.5, 2))
    thing = rng.choice(("jars of jam", "books", "glasses", "candles", "oranges", "toy cars"))
    return (
        f"{a} needs to pack {items} {thing} into boxes that hold {box} each. How many boxes are "
        f"needed, and how many {thing} go in the last box? Each box costs {_money(cost)} dollars; "
        "what is the total cost of the boxes?"
    )


WORD_PROBLEMS = (
    _wp_shopping, _wp_savings, _wp_baking, _wp_travel, _wp_reading, _wp_wages, _wp_tickets,
    _wp_garden, _wp_discount, _wp_ages, _wp_tank, _wp_recipe, _wp_bus, _wp_fuel, _wp_schedule,
    _wp_packing,
)  # fmt: skip
WP_ASK = (
    "Show your reasoning step by step, then give the final answer.",
    "Explain each step and put the final answer on its own line.",
    "Work it out step by step.",
    "Show your working.",
    "Give the answer and explain how you got it.",
    "Think step by step, and end with 'Answer:' followed by the result.",
    "Please write out every calculation.",
    "Explain the solution as you would to a student, then state the final answer.",
)
WP_FRAME = (
    "{problem} {ask}",
    "{ask}\n\n{problem}",
    "Solve this word problem. {ask}\n\n{problem}",
    "Can you help me with this maths problem? {problem}",
    "Here is a problem from my homework: {problem} {ask}",
    "{problem}\n\n{ask}",
    "Problem: {problem}\n{ask}",
)


def _word_problem(rng: random.Random) -> str:
    problem = rng.choice(WORD_PROBLEMS)(rng, rng.choice(NAMES))
    return rng.choice(WP_FRAME).format(problem=problem, ask=rng.choice(WP_ASK))


# ---------------------------------------------------------------------------------------------
# 5. Answers from given context


def _facts(rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """A few facts about a made-up club, shop, hotel or course: (subject, [(fact, question)])."""
    name, name2 = rng.sample(NAMES, 2)
    town, day, month = rng.choice(TOWNS), rng.choice(DAYS), rng.choice(MONTHS)
    hh, fee, n = rng.randint(8, 19), rng.randrange(10, 200, 5), rng.randint(12, 300)
    kind = rng.randrange(5)
    if kind == 0:
        club = f"{town} {rng.choice(HOBBIES)} Club"
        return club, [
            (f"The {club} meets every {day} at {hh}:00 in the {rng.choice(VENUES)}.",
             "When and where does the club meet?"),
            (f"Membership costs {fee} dollars a year, or half that for students.",
             "How much does a student pay for a year of membership?"),
            (f"It was founded in {rng.randint(1950, 2020)} by {name} {rng.choice(SURNAMES)}.",
             "Who founded the club, and in which year?"),
            (f"It has {n} members, {rng.randint(2, 11)} of whom joined this year.",
             "How many members did the club have before this year?"),
            (f"The current president is {name2}.", "Who is the president of the club?"),
            (f"New members get a free {rng.choice(('mug', 'T-shirt', 'tote bag', 'notebook'))} "
             "on their first visit.", "What do new members receive?"),
            (f"The club's annual show takes place in {month}.", "When is the annual show?"),
            (f"Meetings are cancelled during the {rng.choice(('summer', 'winter'))} holidays.",
             "Does the club meet during the holidays?"),
        ]  # fmt: skip
    if kind == 1:
        shop = f"{name}'s {rng.choice(('Bakery', 'Bike Shop', 'Bookshop', 'Florist', 'Deli'))}"
        return shop, [
            (f"{shop} is open from {min(hh, 10)}:00 to {max(hh, 17)}:00, and closed on {day}s.",
             "What are the opening hours, and on which day is it closed?"),
            (f"It is on {rng.choice(('Station', 'Church', 'Mill', 'High', 'Market'))} Street in "
             f"{town}.", "Where is the shop?"),
            (f"Delivery costs {rng.randint(2, 9)} dollars, and is free for orders over {fee} "
             "dollars.", f"How much is delivery for an order of {max(fee - 15, 5)} dollars?"),
            (f"Items can be returned within {rng.choice((14, 28, 30, 60))} days with a receipt.",
             "How long do customers have to return an item?"),
            (f"The shop employs {rng.randint(2, 14)} people.", "How many people work there?"),
            (f"It opened in {rng.randint(1970, 2022)}.", "When did the shop open?"),
            (f"Card payments under {rng.randint(3, 10)} dollars are not accepted.",
             "Can I pay by card for a 2-dollar purchase?"),
        ]  # fmt: skip
    if kind == 2:
        hotel = f"Hotel {rng.choice(('Belvedere', 'Miramar', 'Aurora', 'Linden', 'Seaview'))}"
        return hotel, [
            (f"Check-in at {hotel} is from {rng.randint(13, 16)}:00, check-out by "
             f"{rng.randint(10, 12)}:00.", "What are the check-in and check-out times?"),
            (f"Breakfast is served from 7:00 to {rng.choice(('9:30', '10:00', '10:30'))} and "
             f"costs {rng.randint(8, 25)} dollars per person.",
             f"How much would breakfast cost for {rng.randint(2, 4)} people?"),
            (f"Parking costs {rng.randint(5, 30)} dollars per night.",
             f"How much is parking for {rng.randint(2, 7)} nights?"),
            (f"The pool is closed every {day} for cleaning.", "When is the pool closed?"),
            (f"The hotel has {n} rooms on {rng.randint(3, 12)} floors.",
             "How many rooms does the hotel have?"),
            (f"Pets are {rng.choice(('welcome', 'not allowed'))}.", "Can I bring my dog?"),
            (f"The airport is {rng.randint(8, 60)} km away, and a shuttle leaves every hour.",
             "How far is the airport, and how can I get there?"),
        ]  # fmt: skip
    if kind == 3:
        if rng.random() < 0.5:
            course = f"{rng.choice(LANGUAGES)} for beginners"
        else:
            course = f"Introduction to {rng.choice(TOPICS)}"
        weeks, per = rng.randint(4, 16), rng.randint(1, 3)
        return course, [
            (f"The course '{course}' starts on {rng.randint(1, 28)} {month}.",
             "When does the course start?"),
            (f"It lasts {weeks} weeks, with {per} session{'s' * (per > 1)} a week.",
             "How many sessions are there in total?"),
            (f"The teacher is {name} {rng.choice(SURNAMES)}.", "Who teaches the course?"),
            (f"It costs {fee * 2} dollars; people over 65 pay {fee} dollars.",
             "How much does the course cost for a 70-year-old?"),
            (f"At most {rng.randint(8, 30)} students can take part.",
             "How many students can join?"),
            (f"Sessions are held in room {rng.randint(1, 40)} of the {rng.choice(VENUES)}.",
             "Where are the sessions held?"),
            ("A certificate is given to students who attend at least 80% of the sessions.",
             "What do students need to do to get a certificate?"),
        ]  # fmt: skip
    person = f"{name} {rng.choice(SURNAMES)}"
    return person, [
        (f"{person} was born in {town} in {rng.randint(1950, 2005)}.",
         f"Where and when was {name} born?"),
        (f"{name} works as {_a(rng.choice(JOBS))}.", f"What is {name}'s job?"),
        (f"{name} speaks {_join(rng.sample(sorted(set(LANGUAGES)), 2))} as well as English.",
         f"Which languages does {name} speak?"),
        (f"{name} has {rng.randint(1, 4)} {rng.choice(('cats', 'dogs', 'rabbits'))}.",
         f"What pets does {name} have?"),
        (f"{name}'s favourite dish is {rng.choice(DISHES)}.", f"What does {name} like to eat?"),
        (f"{name} moved to {rng.choice(CITIES)} in {month} last year.",
         f"Where does {name} live now?"),
        (f"{name} has {rng.randint(0, 4)} brothers and {rng.randint(0, 4)} sisters.",
         f"How many siblings does {name} have?"),
    ]  # fmt: skip


def _employee(r: random.Random) -> list[tuple[str, str, str]]:
    return [
        ("Name", f"{r.choice(NAMES)} {r.choice(SURNAMES)}", "What is the employee's name?"),
        ("Department", r.choice(("Sales", "Finance", "IT", "Legal", "Design", "HR")),
         "Which department does the employee work in?"),
        ("Start date", f"{r.randint(1, 28)} {r.choice(MONTHS)} {r.randint(2005, 2024)}",
         "When did the employee start?"),
        ("Office", f"{r.choice(CITIES)}, floor {r.randint(1, 9)}",
         "Which city is the employee's office in?"),
        ("Manager", r.choice(NAMES), "Who is the employee's manager?"),
        ("Phone extension", str(r.randint(100, 999)), "What is the employee's phone extension?"),
        ("Leave days left", str(r.randint(0, 30)),
         "How many days of leave does the employee have left?"),
    ]  # fmt: skip


def _order(r: random.Random) -> list[tuple[str, str, str]]:
    (item, price), count = _good(r), r.randint(1, 4)
    shipping = r.choice((("standard", 5), ("express", 15), ("pick-up in store", 0)))
    return [
        ("Order number", str(r.randint(10000, 99999)), "What is the order number?"),
        ("Customer", f"{r.choice(NAMES)} {r.choice(SURNAMES)}", "Who placed the order?"),
        ("Items", f"{count} x {item} ({price} dollars each)", "What was ordered, and how many?"),
        ("Shipping", f"{shipping[0]} ({shipping[1]} dollars)",
         "Which shipping method was chosen, and what did it cost?"),
        ("Total", f"{count * price + shipping[1]} dollars", "How much did the order cost?"),
        ("Status", r.choice(("processing", "shipped", "delivered", "cancelled")),
         "Has the order been delivered?"),
        ("Expected delivery", f"{r.choice(DAYS)} {r.randint(1, 28)} {r.choice(MONTHS)}",
         "When should the order arrive?"),
    ]  # fmt: skip


def _booking(r: random.Random) -> list[tuple[str, str, str]]:
    origin, destination = r.sample(CITIES, 2)
    return [
        ("Passenger", f"{r.choice(NAMES)} {r.choice(SURNAMES)}", "What is the passenger's name?"),
        ("Flight", f"{r.choice(('SX', 'KL', 'TP', 'LH', 'AZ'))}{r.randint(100, 999)}",
         "What is the flight number?"),
        ("From", origin, "Where does the flight leave from?"),
        ("To", destination, "Where is the passenger flying to?"),
        ("Departure", f"{r.randint(5, 22):02d}:{r.choice(('05', '20', '35', '50'))}",
         "What time does the flight leave?"),
        ("Seat", f"{r.randint(1, 38)}{r.choice('ABCDEF')}", "Which seat is booked?"),
        ("Baggage", r.choice(("cabin bag only", "1 checked bag (23 kg)", "none")),
         "Can the passenger check in a suitcase?"),
        ("Meal", r.choice(("vegetarian", "standard", "none")), "Which meal was ordered?"),
    ]  # fmt: skip


def _loan(r: random.Random) -> list[tuple[str, str, str]]:
    month, day = r.randrange(11), r.randint(1, 28)
    due, due_month = day + 7 * r.choice((2, 3)), month
    if due > 28:  # every month has 28 days: good enough for a due date
        due, due_month = due - 28, month + 1
    return [
        ("Borrower", f"{r.choice(NAMES)} {r.choice(SURNAMES)}", "Who borrowed the book?"),
        ("Title", f"A Short History of {r.choice(TOPICS).title()}", "Which book was borrowed?"),
        ("Borrowed", f"{day} {MONTHS[month]}", "When was the book borrowed?"),
        ("Due", f"{due} {MONTHS[due_month]}", "When is the book due?"),
        ("Renewals", f"{r.randint(0, 3)} of 3 used",
         "How many more times can the loan be renewed?"),
        ("Fine per day late", f"{r.choice(('0.10', '0.20', '0.25', '0.50'))} dollars",
         "How much is the fine for a book that is 4 days late?"),
    ]  # fmt: skip


RECORDS = {"employee": _employee, "order": _order, "booking": _booking, "library loan": _loan}


def _league_row(r: random.Random) -> tuple:
    won, drawn, lost = r.randint(0, 12), r.randint(0, 6), r.randint(0, 12)
    team = f"{r.choice(TOWNS)} {r.choice(('United', 'Rovers', 'City', 'Athletic'))}"
    return team, won + drawn + lost, won, drawn, lost


def _train_row(r: random.Random) -> tuple:
    dep = r.randrange(6 * 60, 20 * 60, 5)
    arr = dep + r.randrange(25, 240, 5)
    return (
        f"{r.choice(('IC', 'RE', 'EX'))} {r.randint(100, 999)}",
        f"{dep // 60:02d}:{dep % 60:02d}",
        f"{arr // 60:02d}:{arr % 60:02d}",
        r.randint(1, 12),
    )


def _weather_row(r: random.Random) -> tuple:
    high = r.randint(-2, 36)
    return r.choice(CITIES), high, high - r.randint(3, 12), r.randint(0, 40)


TABLES = {
    "products": (
        ("Item", "Price ($)", "In stock"),
        lambda r: (lambda g: (g[0].capitalize(), g[1], r.randint(0, 60)))(_good(r)),
    ),
    "trains": (
        ("Train", "Departs", "Arrives", "Platform"),
        _train_row,
    ),
    "league": (
        ("Team", "Played", "Won", "Drawn", "Lost"),
        _league_row,
    ),
    "weather": (
        ("City", "High (C)", "Low (C)", "Rain (mm)"),
        _weather_row,
    ),
    "scores": (
        ("Student", "Maths", "Science", "English"),
        lambda r: (r.choice(NAMES), r.randint(35, 100), r.randint(35, 100), r.randint(35, 100)),
    ),
}
TABLE_QUESTIONS = {
    "products": (
        "Which item is the cheapest, and which is the most expensive?",
        "What is the total number of items in stock?",
        "Which items are out of stock?",
        "How much would it cost to buy one of each item?",
        "What is the price of the {row}?",
        "Which items cost more than 100 dollars?",
        "What colour is the {row}?",
        "Who makes the {row}?",
    ),
    "trains": (
        "Which train arrives first?",
        "How long does the {row} journey take?",
        "From which platform does the {row} leave?",
        "Which train has the longest journey?",
        "How much does a ticket on the {row} cost?",
        "I need to arrive before 18:00. Which trains can I take?",
    ),
    "league": (
        "A win is worth 3 points and a draw 1 point. Which team has the most points?",
        "Which team has lost the most games?",
        "How many games has {row} played, and how many has it won?",
        "Who is the coach of {row}?",
        "How many games were drawn in total?",
        "Rank the teams by number of wins.",
    ),
    "weather": (
        "Which city was the warmest, and which was the coldest?",
        "In which city was the difference between high and low the largest?",
        "What was the low temperature in {row}?",
        "Which cities had more than 10 mm of rain?",
        "Was it windy in {row}?",
        "What was the average high temperature across all the cities?",
    ),
    "scores": (
        "Who has the highest total score?",
        "What is {row}'s average mark?",
        "Which subject has the highest class average?",
        "Which students scored below 50 in any subject?",
        "What mark did {row} get in History?",
        "Who did best in Science?",
    ),
}
CONTEXT_FRAME = (
    "Use only the information below to answer the question. If the answer is not there, say "
    "that it is not given.\n\n{context}\n\nQuestion: {q}",
    "Context:\n{context}\n\nBased only on the context above, answer: {q}",
    "{context}\n\n{q} Answer from the information above only.",
    "Here are some notes:\n{context}\n\nUsing these notes and nothing else, {ql}",
    "Answer the question using the {what} below. Do not guess; if it does not say, tell me.\n\n"
    "{context}\n\n{q}",
    "{q}\n\nUse this {what}:\n{context}",
    "Given the following {what}:\n\n{context}\n\n{q} {style}",
    "I only have this {what}:\n{context}\n\nFrom it, can you tell me: {q}",
)
CONTEXT_FRAME_MANY = (
    "Use only the information below to answer the questions. If an answer is not there, say "
    "that it is not given.\n\n{context}\n\nQuestions:\n{qs}",
    "Context:\n{context}\n\nBased only on the context above, answer:\n{qs}",
    "{context}\n\nAnswer from the {what} above only.\n{qs}",
    "Here are some notes:\n{context}\n\nUsing these notes and nothing else, answer these "
    "questions:\n{qs}\n{style}",
    "Given the following {what}:\n\n{context}\n\n{qs}\n\n{style}",
)
CONTEXT_STYLES = (
    "Explain which part of the context you used.",
    "Answer in one sentence.",
    "Show any calculation.",
    "Answer with just the value, then one line of explanation.",
    "",
)


def _context_table(rng: random.Random) -> tuple[str, str, list[str]]:
    kind = rng.choice(sorted(TABLES))
    header, make_row = TABLES[kind]
    rows, keys = [], set()
    while len(rows) < rng.randint(3, 6):
        row = make_row(rng)
        if row[0] not in keys:
            keys.add(row[0])
            rows.append(row)
    style = rng.choice(("markdown", "csv", "text"))
    if style == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    elif style == "csv":
        lines = [",".join(header)] + [",".join(str(x) for x in row) for row in rows]
    else:
        lines = ["; ".join(f"{h}: {x}" for h, x in zip(header, row, strict=True)) for row in rows]
    row = rng.choice(rows)[0]
    questions = [q.format(row=row) for q in TABLE_QUESTIONS[kind]]
    return "\n".join(lines), "table", questions


def _context_record(rng: random.Random) -> tuple[str, str, list[str]]:
    kind = rng.choice(sorted(RECORDS))
    fields = RECORDS[kind](rng)
    shown = [fields[0]] + rng.sample(fields[1:], rng.randint(3, len(fields) - 1))
    hidden = [f for f in fields if f not in shown]
    values = {key: value for key, value, _ in shown}
    style = rng.choice(("lines", "json", "inline"))
    if style == "lines":
        text = "\n".join(f"{k}: {v}" for k, v in values.items())
    elif style == "json":
        text = json.dumps(values, indent=rng.choice((None, 2)))
    else:
        text = f"{kind.capitalize()} record - " + "; ".join(f"{k}: {v}" for k, v in values.items())
    questions = [q for _, _, q in shown[1:]]
    questions += [q for _, _, q in hidden]  # not in the record: the answer is "not given"
    return text, f"{kind} record", questions


def _context_facts(rng: random.Random) -> tuple[str, str, list[str]]:
    subject, facts = _facts(rng)
    k = rng.randint(3, min(6, len(facts) - 1))
    shown = rng.sample(facts, k)
    hidden = [f for f in facts if f not in shown]
    bullet = rng.choice(("- ", "* ", "", "num"))
    if bullet == "num":
        text = "\n".join(f"{i + 1}. {f}" for i, (f, _) in enumerate(shown))
    elif bullet:
        text = "\n".join(bullet + f for f, _ in shown)
    else:
        text = " ".join(f for f, _ in shown)
    heading = rng.choice(("About {}:", "{}", "Facts about {}:", "{} - key facts"))
    questions = [q for _, q in shown] + [q for _, q in hidden[:1]]
    return heading.format(subject) + "\n" + text, "information", questions


def _context_qa(rng: random.Random) -> str:
    r = rng.random()
    make = _context_facts if r < 0.4 else _context_record if r < 0.7 else _context_table
    context, what, questions = make(rng)
    k = rng.choice((1, 1, 1, 2, 3))
    qs = rng.sample(questions, min(k, len(questions)))
    style = rng.choice(CONTEXT_STYLES)
    if len(qs) > 1:
        block = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(qs))
        frame = rng.choice(CONTEXT_FRAME_MANY)
        return frame.format(context=context, qs=block, what=what, style=style).strip()
    q = qs[0]
    ql = q[0].lower() + q[1:]
    frame = rng.choice(CONTEXT_FRAME)
    return frame.format(context=context, q=q, ql=ql, what=what, style=style).strip()


# ---------------------------------------------------------------------------------------------

_MAKERS = {
    "translation": _translation,
    "summarization": _summarization,
    "passage_qa": _passage_qa,
    "word_problems": _word_problem,
    "context_qa": _context_qa,
}


def task_prompts(n: int, seed: int = 0) -> list[str]:
    """n user turns (plain text, no chat template) drawn with `seed` from the five task families
    in equal proportions; deterministic for (n, seed) and distinct."""
    return [text for _, text in task_prompts_by_family(n, seed)]


def task_prompts_by_family(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """task_prompts(n, seed) with the family (one of TASK_FAMILIES) each prompt was drawn from.
    Families take turns in a shuffled order within every block of five, so their counts differ
    by at most one."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    _Texts.load()
    rng = random.Random(seed)
    out, seen, block = [], set(), []
    while len(out) < n:
        if not block:
            block = list(TASK_FAMILIES)
            rng.shuffle(block)
        family = block.pop()
        for _ in range(1000):
            text = _MAKERS[family](rng)
            if text not in seen and len(text) <= MAX_CHARS:
                break
        else:
            raise RuntimeError(f"could not draw a new {family} prompt")  # pragma: no cover
        seen.add(text)
        out.append((family, text))
    return out
