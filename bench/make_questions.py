"""Write bench/questions/heldout.jsonl: the question set the quality claims are reported on.

    python bench/make_questions.py          # rewrites the file; the same seed gives the same file

Short questions with one unambiguous answer each, checked by normalised match
(conclave.coordination.answers.matches), across arithmetic, units, geography, science, dates, spelling
and string puzzles, and short code reading. Generated questions come from a seeded generator; facts are
listed below. Nothing here overlaps bench/questions.jsonl, the set the `local` team's personas were
chosen on. Each question carries its split: `dev` (for any tuning) or `test` (only for reporting),
drawn per kind with a fixed seed so both splits hold every kind in the same proportion.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE / "questions" / "heldout.jsonl"
TUNED_ON = HERE / "questions.jsonl"
SEED = 20261123

GEOGRAPHY = [  # (question, answers)
    ("What is the capital of Germany?", ["Berlin"]),
    ("What is the capital of Italy?", ["Rome"]),
    ("What is the capital of Spain?", ["Madrid"]),
    ("What is the capital of Japan?", ["Tokyo"]),
    ("What is the capital of Canada?", ["Ottawa"]),
    ("What is the capital of Australia?", ["Canberra"]),
    ("What is the capital of Russia?", ["Moscow"]),
    ("What is the capital of China?", ["Beijing"]),
    ("What is the capital of Egypt?", ["Cairo"]),
    ("What is the capital of Greece?", ["Athens"]),
    ("What is the capital of Portugal?", ["Lisbon"]),
    ("What is the capital of Norway?", ["Oslo"]),
    ("What is the capital of Sweden?", ["Stockholm"]),
    ("What is the capital of Ireland?", ["Dublin"]),
    ("What is the capital of Austria?", ["Vienna"]),
    ("What is the capital of Poland?", ["Warsaw"]),
    ("What is the capital of Kenya?", ["Nairobi"]),
    ("What is the capital of Argentina?", ["Buenos Aires"]),
    ("What is the capital of Mexico?", ["Mexico City"]),
    ("What is the capital of India?", ["New Delhi", "Delhi"]),
    ("What is the capital of South Korea?", ["Seoul"]),
    ("What is the capital of Thailand?", ["Bangkok"]),
    ("What is the capital of Turkey?", ["Ankara"]),
    ("What is the capital of Peru?", ["Lima"]),
    ("What is the capital of Cuba?", ["Havana"]),
    ("What is the capital of Finland?", ["Helsinki"]),
    ("What is the capital of Denmark?", ["Copenhagen"]),
    ("What is the capital of Hungary?", ["Budapest"]),
    ("What is the capital of Belgium?", ["Brussels"]),
    ("What is the capital of the Netherlands?", ["Amsterdam"]),
    ("On which continent is Egypt?", ["Africa"]),
    ("On which continent is Brazil?", ["South America"]),
    ("On which continent is Japan?", ["Asia"]),
    ("On which continent is France?", ["Europe"]),
    ("On which continent is Kenya?", ["Africa"]),
    ("On which continent is Canada?", ["North America"]),
    ("On which continent is Peru?", ["South America"]),
    ("On which continent is Thailand?", ["Asia"]),
    ("What is the longest river in Africa?", ["Nile"]),
    ("Which country has the largest population in South America?", ["Brazil"]),
    ("In which country is the Eiffel Tower?", ["France"]),
    ("In which country are the pyramids of Giza?", ["Egypt"]),
    ("In which country is the Colosseum?", ["Italy"]),
    ("In which city is the Statue of Liberty?", ["New York"]),
    ("What is the largest desert in Africa?", ["Sahara"]),
    ("What is the highest mountain on Earth?", ["Everest"]),
    ("Which ocean lies between Europe and North America?", ["Atlantic"]),
    ("What is the largest country by area?", ["Russia"]),
    ("Which country is shaped like a boot?", ["Italy"]),
    ("What is the smallest continent?", ["Australia"]),
]
SCIENCE = [
    ("What is the chemical symbol for iron?", ["Fe"]),
    ("What is the chemical symbol for silver?", ["Ag"]),
    ("What is the chemical symbol for potassium?", ["K"]),
    ("What is the chemical symbol for helium?", ["He"]),
    ("What is the chemical symbol for carbon?", ["C"]),
    ("What is the chemical symbol for hydrogen?", ["H"]),
    ("What is the chemical symbol for copper?", ["Cu"]),
    ("What is the chemical symbol for lead?", ["Pb"]),
    ("Which planet is the second from the Sun?", ["Venus"]),
    ("Which planet has the most famous rings?", ["Saturn"]),
    ("Which planet is the third from the Sun?", ["Earth"]),
    ("What is the farthest planet from the Sun?", ["Neptune"]),
    ("What is the natural satellite of the Earth called?", ["the Moon", "Moon"]),
    ("What gas do humans need to breathe in to live?", ["oxygen"]),
    ("What gas do humans breathe out?", ["carbon dioxide", "CO2"]),
    ("How many bones does an adult human have?", ["206"]),
    ("How many chambers does the human heart have?", ["4"]),
    ("What organ pumps blood through the body?", ["heart"]),
    ("What is the largest organ of the human body?", ["skin"]),
    ("How many legs does a crab have?", ["10"]),
    ("How many legs does an octopus have?", ["8"]),
    ("How many wings does a bee have?", ["4"]),
    ("What do bees make?", ["honey"]),
    ("What is the boiling point of water in degrees Fahrenheit at sea level?", ["212"]),
    ("What is the freezing point of water in degrees Fahrenheit?", ["32"]),
    ("What force pulls objects toward the Earth?", ["gravity"]),
    ("What is the center of an atom called?", ["nucleus"]),
    ("What particle has a negative charge?", ["electron"]),
    ("What is frozen water called?", ["ice"]),
    ("What is the largest mammal?", ["blue whale"]),
    ("What animal is known as the king of the jungle?", ["lion"]),
    ("What is a baby cat called?", ["kitten"]),
    ("What is a baby dog called?", ["puppy"]),
    ("What color is chlorophyll?", ["green"]),
    ("What is the main gas in the Earth's atmosphere?", ["nitrogen"]),
    ("How many teeth does an adult human usually have?", ["32"]),
    ("What metal is liquid at room temperature?", ["mercury"]),
    ("What star is at the center of our solar system?", ["the Sun", "Sun"]),
    ("Which animal lays the largest eggs?", ["ostrich"]),
    ("How many hearts does an octopus have?", ["3"]),
    ("What is the chemical symbol for calcium?", ["Ca"]),
    ("What is the chemical symbol for nitrogen?", ["N"]),
    ("What is the chemical symbol for zinc?", ["Zn"]),
    ("What is the chemical symbol for chlorine?", ["Cl"]),
    ("How many legs does a cow have?", ["4"]),
    ("What is a baby sheep called?", ["lamb"]),
]
DATES = [
    ("What day comes after Monday?", ["Tuesday"]),
    ("What day comes after Thursday?", ["Friday"]),
    ("What day comes before Sunday?", ["Saturday"]),
    ("What day comes before Wednesday?", ["Tuesday"]),
    ("What month comes after March?", ["April"]),
    ("What month comes after August?", ["September"]),
    ("What month comes before December?", ["November"]),
    ("What month comes before July?", ["June"]),
    ("What is the first month of the year?", ["January"]),
    ("What is the last month of the year?", ["December"]),
    ("How many days are in January?", ["31"]),
    ("How many days are in April?", ["30"]),
    ("How many days are in February in a non-leap year?", ["28"]),
    ("How many days are in June?", ["30"]),
    ("How many days are in October?", ["31"]),
    ("How many days are in a non-leap year?", ["365"]),
    ("In which month is Christmas Day?", ["December"]),
    ("In which month is New Year's Day?", ["January"]),
    ("How many weeks are in a year?", ["52"]),
    ("How many days are in two weeks?", ["14"]),
    ("In what year did World War II end?", ["1945"]),
    ("In what year did World War I begin?", ["1914"]),
    ("In what year did humans first land on the Moon?", ["1969"]),
    ("In what year did the Berlin Wall fall?", ["1989"]),
    ("In what year did Columbus first reach the Americas?", ["1492"]),
    ("How many years are in a century?", ["100"]),
    ("How many years are in a decade?", ["10"]),
    ("How many years are in a millennium?", ["1000"]),
]
CODE = [  # (question, answers): short Python reading
    ("What does the Python expression len('hello') evaluate to?", ["5"]),
    ("What does the Python expression 3 * 4 + 2 evaluate to?", ["14"]),
    ("What does the Python expression 2 ** 5 evaluate to?", ["32"]),
    ("What does the Python expression 17 // 5 evaluate to?", ["3"]),
    ("What does the Python expression 17 % 5 evaluate to?", ["2"]),
    ("What does the Python expression max([4, 9, 2]) evaluate to?", ["9"]),
    ("What does the Python expression min([4, 9, 2]) evaluate to?", ["2"]),
    ("What does the Python expression sum([1, 2, 3, 4]) evaluate to?", ["10"]),
    ("What does the Python expression len([1, 2, 3]) evaluate to?", ["3"]),
    ("What does the Python expression 'abc'.upper() evaluate to?", ["ABC"]),
    ("What does the Python expression 'Hello'.lower() evaluate to?", ["hello"]),
    ("What does the Python expression sorted([3, 1, 2])[0] evaluate to?", ["1"]),
    ("What does the Python expression [1, 2, 3][-1] evaluate to?", ["3"]),
    ("What does the Python expression 'banana'.count('a') evaluate to?", ["3"]),
    ("What does the Python expression abs(-7) evaluate to?", ["7"]),
    ("What does the Python expression int('42') + 1 evaluate to?", ["43"]),
    ("What does the Python expression len('') evaluate to?", ["0"]),
    ("What does the Python expression 10 - 3 * 2 evaluate to?", ["4"]),
    ("What does the Python expression (10 - 3) * 2 evaluate to?", ["14"]),
    ("What does the Python expression round(2.7) evaluate to?", ["3"]),
    ("What does the Python expression 'cat' + 'dog' evaluate to?", ["catdog"]),
    ("What does the Python expression len('hi there') evaluate to?", ["8"]),
    ("What does the Python expression 7 > 3 evaluate to?", ["True"]),
    ("What does the Python expression 2 == 3 evaluate to?", ["False"]),
    ("What does the Python expression list(range(3))[-1] evaluate to?", ["2"]),
    ("What does the Python expression len(range(10)) evaluate to?", ["10"]),
    ("What does the Python expression 'python'[0] evaluate to?", ["p"]),
    ("What does the Python expression 9 // 2 evaluate to?", ["4"]),
]
UNIT_FACTS = [
    ("How many centimeters are in a meter?", ["100"]),
    ("How many minutes are in an hour?", ["60"]),
    ("How many inches are in a foot?", ["12"]),
    ("How many feet are in a yard?", ["3"]),
    ("How many milliliters are in a liter?", ["1000"]),
    ("How many ounces are in a pound?", ["16"]),
    ("How many cents are in a dollar?", ["100"]),
    ("How many items are in a dozen?", ["12"]),
    ("How many sides does a pentagon have?", ["5"]),
    ("How many sides does an octagon have?", ["8"]),
    ("How many sides does a square have?", ["4"]),
    ("How many degrees are in a right angle?", ["90"]),
    ("How many degrees are in a full circle?", ["360"]),
    ("How many seconds are in an hour?", ["3600"]),
    ("How many minutes are in a day?", ["1440"]),
    ("How many hours are in a week?", ["168"]),
]
WORDS = [
    "apple",
    "river",
    "planet",
    "garden",
    "window",
    "orange",
    "silver",
    "pencil",
    "rocket",
    "candle",
    "bridge",
    "forest",
    "castle",
    "dragon",
    "summer",
    "winter",
    "butter",
    "mirror",
    "yellow",
    "tomato",
    "lemon",
    "tiger",
    "zebra",
    "piano",
    "cloud",
    "stone",
    "light",
    "water",
    "green",
    "horse",
    "table",
    "chair",
    "bread",
    "grape",
    "mouse",
    "train",
    "paper",
    "music",
    "smile",
    "ocean",
]


def arithmetic(rng: random.Random) -> list[tuple[str, list[str]]]:
    out = []
    for _ in range(28):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        out.append((f"What is {a} plus {b}?", [str(a + b)]))
    for _ in range(20):
        a, b = rng.randint(50, 199), rng.randint(1, 49)
        out.append((f"What is {a} minus {b}?", [str(a - b)]))
    for _ in range(25):
        a, b = rng.randint(2, 12), rng.randint(3, 15)
        out.append((f"What is {a} times {b}?", [str(a * b)]))
    for _ in range(14):
        b, q = rng.randint(2, 12), rng.randint(2, 12)
        out.append((f"What is {b * q} divided by {b}?", [str(q)]))
    return out


def units(rng: random.Random) -> list[tuple[str, list[str]]]:
    scales = [
        ("centimeters", "meters", 100),
        ("grams", "kilograms", 1000),
        ("minutes", "hours", 60),
        ("seconds", "minutes", 60),
        ("hours", "days", 24),
        ("days", "weeks", 7),
        ("months", "years", 12),
        ("millimeters", "centimeters", 10),
        ("meters", "kilometers", 1000),
        ("inches", "feet", 12),
    ]
    out = list(UNIT_FACTS)
    for small, big, factor in scales:
        for count in rng.sample(range(2, 10), 2):
            out.append((f"How many {small} are in {count} {big}?", [str(count * factor)]))
    return out


def strings(rng: random.Random) -> list[tuple[str, list[str]]]:
    words = rng.sample(WORDS, len(WORDS))
    out = []
    for word in words[:10]:
        out.append((f"What is the word '{word}' spelled backwards?", [word[::-1]]))
    for word in words[10:20]:
        out.append((f"How many letters are in the word '{word}'?", [str(len(word))]))
    for word in words[20:28]:
        out.append((f"What is the first letter of the word '{word}'?", [word[0]]))
    for word in words[28:36]:
        out.append((f"What is the last letter of the word '{word}'?", [word[-1]]))
    for word in words[36:40] + words[:6]:
        out.append(
            (
                f"How many times does the letter '{word[1]}' appear in the word '{word}'?",
                [str(word.count(word[1]))],
            )
        )
    return out


def build() -> list[dict[str, object]]:
    rng = random.Random(SEED)
    kinds = {
        "arithmetic": arithmetic(rng),
        "units": units(rng),
        "geography": GEOGRAPHY,
        "science": SCIENCE,
        "dates": DATES,
        "string": strings(rng),
        "code": CODE,
    }
    tuned = {json.loads(line)["question"] for line in TUNED_ON.read_text().splitlines() if line.strip()}
    rows: list[dict[str, object]] = []
    for kind, items in kinds.items():
        fresh = list(dict.fromkeys(q for q, _ in items if q not in tuned))
        answers = dict(items)
        order = rng.sample(fresh, len(fresh))
        test = set(order[: len(order) // 2])
        for question in fresh:
            rows.append(
                {
                    "kind": kind,
                    "question": question,
                    "answers": answers[question],
                    "split": "test" if question in test else "dev",
                }
            )
    for number, row in enumerate(rows, start=1):
        row["id"] = number
    return rows


def main() -> None:
    rows = build()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(
        "".join(json.dumps({"id": r["id"], **{k: v for k, v in r.items() if k != "id"}}) + "\n" for r in rows)
    )
    splits = {s: sum(r["split"] == s for r in rows) for s in ("dev", "test")}
    print(f"wrote {OUT}: {len(rows)} questions, {splits}")


if __name__ == "__main__":
    main()
