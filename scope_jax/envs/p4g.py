"""Persuasion for Good with LLM players: a persuader asks a simulated participant for a donation.

The agent is the persuader: it is asked to persuade its chat partner to give part of a $2 task payment
to Save the Children. The simulator is the persuadee: it plays a persona card built from one real
participant of the P4G study (`FullData/full_info.csv`: Big-Five, moral foundations, Schwartz values,
decision style, demographics; Wang et al., ACL 2019) and is told to treat the money as its own.

Each role speaks up to `max_turns` times, the persuader first (cued by a note that its partner joined).
The donation is what the persuadee states in its own turns (`scope_jax.envs.p4g_donations`: a donation
verb with an amount, the last statement wins); if no readable amount was stated by the end, one closing
question asks for it and the persuadee answers in one extra turn (`closing`). A dialogue whose donation
still cannot be read (no amount, or one above $2) is *unreadable*, its own outcome, not $0.
Reward: donation / 2 for both roles (the simulator's "cooperative" reward; the adversarial objective
negates the agent's), `unreadable_reward` for an unreadable dialogue; outcomes: `donation` and `success`
(donation > 0; both NaN when unreadable) and `unreadable` (0 or 1).

Personas are the persuadee rows of the file; a seeded hash of the participant id puts
`heldout_fraction` of the participants (all their rows) in the held-out split, which evaluation (split
"eval") draws from. A second hash of the id cuts the other participants ("train") into the *judge* split
(`judge_fraction` of them), which the held-out judge is fitted on, and the *simulator* split, which
every training simulator and data anchor draws from: no person is in two of judge, simulator and eval.
The loop's "train" draws from `train_split`. A missing or malformed data file raises `P4GDataError`,
one line naming the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pathlib
from typing import Any

import numpy as np

from scope_jax.config import FRACTION
from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.envs.p4g_donations import extract_answer, extract_donation, readable
from scope_jax.envs.p4g_csv import MAX_DONATION, P4GDataError, read_rows

DEFAULT_DATA_DIR = "../shared/data/p4g"
INFO_FILE = "FullData/full_info.csv"

BIG_FIVE = {  # column: (low-score description, high-score description); scale 1..5
    "extrovert": ("reserved", "outgoing"),
    "agreeable": ("critical of others", "warm"),
    "conscientious": ("disorganised", "organised"),
    "neurotic": ("calm", "easily stressed"),
    "open": ("conventional", "open to new ideas"),
}
MORAL_FOUNDATIONS = {  # scale 1..6
    "care": "caring for people who suffer",
    "fairness": "fairness",
    "loyalty": "loyalty to your group",
    "authority": "respect for authority",
    "purity": "purity",
    "freedom": "personal liberty",
}
VALUES = {  # Schwartz values, scale 1..6
    "conform": "following rules",
    "tradition": "tradition",
    "benevolence": "helping people close to you",
    "universalism": "the welfare of all people",
    "self_direction": "independent thought",
    "stimulation": "excitement",
    "hedonism": "enjoying life",
    "achievement": "personal success",
    "power": "status",
    "security": "safety",
}
DECISION_STYLE = ("rational", "intuitive")  # scale 1..5
NUMERIC = (*BIG_FIVE, *MORAL_FOUNDATIONS, *VALUES, *DECISION_STYLE, "age", "income")
CATEGORICAL = ("sex", "race", "edu", "marital", "employment", "religion", "ideology")
REQUIRED_COLUMNS = ("B2", "B3", "B4", "B6", *(f"{name}.x" for name in NUMERIC + CATEGORICAL))

PERSUADER_PROMPT = (
    "You are chatting with another participant of an online study. Persuade them to donate part or all of "
    "their $2 task payment to Save the Children, a charity that helps children in developing countries with "
    "health care, education and safety; the donation is taken out of their payment. Be friendly and honest, "
    "use arguments and questions, and keep each message to one or two sentences.")
PERSUADEE_PROMPT = (
    "You are a participant in a paid online study, chatting with another participant. Play this person, "
    "and never say that you are an AI.\n{card}\n"
    "You earned $2 for this task. Your chat partner may ask you to give some of it to a charity; what you "
    "give is taken out of your real payment, so treat the money as your own. Decide as this person would; "
    "giving nothing is fine. Reply in one or two short sentences.")
OPENING = "(Your chat partner has joined. Start the conversation.)"
CLOSING_QUESTION = ("The chat is over. How much of your $2 do you donate to Save the Children? Answer with "
                    "an amount in dollars, from $0 to $2.")


TRAIN_SPLITS = ("train", "simulator")  # what the loop's "train" may draw from: never judge people


@dataclasses.dataclass(frozen=True)
class Persona:
    """One persuadee row: participant id, the human's actual donation (None when missing or outside
    $0..$2), numeric traits (None when missing), categorical demographics ("" when missing) and the id of
    the dialogue the row belongs to (B2, in FullData/full_dialog.csv)."""

    participant: str
    donation: float | None
    traits: tuple[tuple[str, float | None], ...]
    demographics: tuple[tuple[str, str], ...]
    dialogue: str = ""

    def __str__(self) -> str:
        return self.participant


def load_personas(data_dir: str | pathlib.Path) -> list[Persona]:
    """The persuadee rows of `data_dir`/FullData/full_info.csv, in file order."""
    path = pathlib.Path(data_dir) / INFO_FILE
    personas = []
    for line, row in read_rows(path, REQUIRED_COLUMNS):
        if row["B4"] == "1":
            try:
                personas.append(_persona(row))
            except _RowError as e:
                raise P4GDataError(f"P4G data file {path}, line {line}: {e}") from None
    if not personas:
        raise P4GDataError(f"P4G data file {path} has no persuadee rows (B4 = 1)")
    return personas


class _RowError(ValueError):
    """A cell that cannot be read."""


def _number(row: dict[str, str | None], column: str) -> float | None:
    text = (row[column] or "").strip()  # a short row's missing cells are None
    try:
        return float(text) if text else None
    except ValueError:
        raise _RowError(f"column {column} holds {text!r}, not a number") from None


def _persona(row: dict[str, str | None]) -> Persona:
    donation = _number(row, "B6")
    if donation is not None and not 0.0 <= donation <= MAX_DONATION:
        donation = None
    return Persona(participant=(row["B3"] or "").strip(), donation=donation,
                   traits=tuple((name, _number(row, f"{name}.x")) for name in NUMERIC),
                   demographics=tuple((name, (row[f"{name}.x"] or "").strip()) for name in CATEGORICAL),
                   dialogue=(row["B2"] or "").strip())


def heldout_score(participant: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, participant): below the held-out fraction = held out."""
    return _uniform(f"{seed}:{participant}")


def judge_score(participant: str, seed: int) -> float:
    """A second uniform number in [0, 1) fixed by (seed, participant), independent of `heldout_score`:
    below the judge fraction = a train participant of the judge split, else of the simulator split."""
    return _uniform(f"{seed}:judge:{participant}")


def _uniform(text: str) -> float:
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def persona_card(persona: Persona) -> str:
    """The persona in plain words (our wording): demographics, personality, morals, values, decisions."""
    traits, facts = dict(persona.traits), dict(persona.demographics)
    about = []
    age = traits["age"]
    who = {"Male": "man", "Female": "woman"}.get(facts["sex"], "person")
    about.append(f"a {int(age)}-year-old {who}" if age is not None and age >= 18 else f"an adult {who}")
    about += [_DEMOGRAPHICS[name][facts[name]] for name in CATEGORICAL
              if name in _DEMOGRAPHICS and facts[name] in _DEMOGRAPHICS[name]]
    if traits["income"] is not None:
        about.append(f"with a {('lower', 'middle', 'higher')[min(int(traits['income'] - 1) // 4, 2)]} income")
    lines = [f"You are {_join(about)}."]
    personality = [pair[traits[name] >= 4] for name, pair in BIG_FIVE.items()
                   if traits[name] is not None and (traits[name] >= 4 or traits[name] <= 2)]
    if personality:
        lines.append(f"You are {_join(personality)}.")
    most, least = _salient(traits, MORAL_FOUNDATIONS)
    if most or least:
        lines.append("Morally, " + _ranking(most, least, "matter{s} to you"))
    most, least = _salient(traits, VALUES)
    if most or least:
        lines.append("In life you value " + _ranking(most, least, ""))
    rational, intuitive = traits["rational"], traits["intuitive"]
    if rational is not None and intuitive is not None and abs(rational - intuitive) >= 1:
        lines.append("You decide by careful reasoning more than by gut feeling." if rational > intuitive
                     else "You decide by gut feeling more than by careful reasoning.")
    return " ".join(lines)


_DEMOGRAPHICS = {
    "race": {"White": "white", "Other": "non-white"},
    "edu": {"Less than four-year college": "without a four-year college degree",
            "Four-year college": "with a four-year college degree",
            "Postgraduate": "with a postgraduate degree"},
    "marital": {"Married": "married", "Unmarried": "not married"},
    "employment": {"Employed for wages": "employed for wages", "Other": "not employed for wages"},
    "religion": {"Protestant": "Protestant", "Catholic": "Catholic", "Atheist": "an atheist",
                 "Other religion": "of another religion"},
    "ideology": {"Liberal": "politically liberal", "Conservative": "politically conservative",
                 "Moderate": "politically moderate"},
}


def _salient(traits: dict[str, float | None], names: dict[str, str]) -> tuple[list[str], list[str]]:
    """Descriptions of the (at most two) highest and the lowest of `names`, each only if it stands at
    least half a point away from this person's own mean over them (scores on these scales run high)."""
    scores = {name: traits[name] for name in names if traits[name] is not None}
    if not scores:
        return [], []
    mean = sum(scores.values()) / len(scores)
    ranked = sorted(scores, key=lambda name: -scores[name])
    most = [names[n] for n in ranked[:2] if scores[n] >= mean + 0.5]
    least = [names[n] for n in ranked[-1:] if scores[n] <= mean - 0.5]
    return most, least


def _ranking(most: list[str], least: list[str], verb: str) -> str:
    """ "A and B matter most to you, and C least." with verb "matter{s} to you" (or without a verb: "A most,
    and C least."); either list may be empty."""
    def part(items: list[str], which: str) -> str:
        words = [_join(items), verb.format(s="s" if len(items) == 1 else ""), which]
        return " ".join(w for w in words if w)

    if most and least:
        return f"{part(most, 'most')}, and {_join(least)} least."
    return part(most, "most") + "." if most else part(least, "least") + "."


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --- the environment -----------------------------------------------------------------------------------

def stated_donation(episode: Episode) -> float | None:
    """The persuadee's last stated donation in `episode` (the closing answer included): dollars, UNREADABLE,
    or None when it stated none."""
    found, answering = None, False
    for message in episode.messages:
        if message.role == ENV:
            answering = message.text == CLOSING_QUESTION
        elif message.role == SIM:
            value = (extract_answer if answering else extract_donation)(message.text)
            found = found if value is None else value
            answering = False
    return found


@dataclasses.dataclass
class P4GEnv:
    """data_dir: the P4G folder (holding FullData/full_info.csv); max_turns: turns per role;
    heldout_fraction / split_seed: which participants are held out (split "eval"); judge_fraction: the
    share of the others in the judge split (the rest: the simulator split); train_split: the split the
    loop's "train" draws from ("train": judge and simulator, "simulator", "judge"); unreadable_reward:
    both roles' reward for a dialogue whose donation cannot be read."""

    data_dir: str = DEFAULT_DATA_DIR
    max_turns: int = 10
    heldout_fraction: float = 0.2
    judge_fraction: float = 0.5
    split_seed: int = 0
    train_split: str = "train"
    unreadable_reward: float = 0.0
    first_speaker: str = AGENT

    def __post_init__(self) -> None:
        if self.train_split not in TRAIN_SPLITS:
            raise ValueError(f"P4G train_split is {self.train_split!r}; one of {', '.join(TRAIN_SPLITS)}")
        for name in ("heldout_fraction", "judge_fraction"):
            if not FRACTION.holds(getattr(self, name)):
                raise ValueError(f"P4G {name} is {getattr(self, name)!r}; it must be {FRACTION.what}")
        self.personas = load_personas(self.data_dir)
        held = lambda p: heldout_score(p.participant, self.split_seed) < self.heldout_fraction
        judge = lambda p: judge_score(p.participant, self.split_seed) < self.judge_fraction
        train = [p for p in self.personas if not held(p)]
        self.splits = {"train": train, "judge": [p for p in train if judge(p)],
                       "simulator": [p for p in train if not judge(p)],
                       "eval": [p for p in self.personas if held(p)], "all": list(self.personas)}
        for split in (self.train_split, "judge"):
            if not self.splits[split]:
                raise ValueError(f"P4G split {split!r} is empty: heldout_fraction {self.heldout_fraction} "
                                 f"and judge_fraction {self.judge_fraction} leave none of the "
                                 f"{len(self.personas)} persuadees in it")

    def sample_scenarios(self, n: int, rng: np.random.Generator, split: str = "train") -> list[Any]:
        """n personas of a split ("train": those of `train_split`; "eval" = held out; "judge", "simulator"
        or "all"), distinct while the split lasts."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; one of {', '.join(self.splits)}")
        pool = self.splits[self.train_split if split == "train" else split]
        return [pool[i] for i in rng.choice(len(pool), n, replace=n > len(pool))]

    def system_prompt(self, scenario: Any, role: str) -> str:
        return PERSUADER_PROMPT if role == AGENT else PERSUADEE_PROMPT.format(card=persona_card(scenario))

    def opening(self, scenario: Any) -> list[Message]:
        """A cue for the persuader only, so that it opens the chat as a reply to something."""
        return [Message(ENV, OPENING, visible_to=(AGENT,))]

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        return TurnResult()

    def closing(self, episode: Episode) -> list[Message]:
        """The closing question, to the persuadee only, when it has not stated a readable donation."""
        if readable(stated_donation(episode)):
            return []
        return [Message(ENV, CLOSING_QUESTION, visible_to=(SIM,))]

    def rewards(self, episode: Episode) -> dict[str, float]:
        donation = stated_donation(episode)
        if not readable(donation):
            return {"agent": self.unreadable_reward, "sim": self.unreadable_reward, "donation": math.nan,
                    "success": math.nan, "unreadable": 1.0}
        return {"agent": donation / MAX_DONATION, "sim": donation / MAX_DONATION, "donation": donation,
                "success": float(donation > 0), "unreadable": 0.0}
