"""The human P4G dialogues as episodes of the P4G environment: what a simulator fine-tuned on people reads.

Each persuadee row of `FullData/full_info.csv` (a `Persona`) took part in one dialogue of
`FullData/full_dialog.csv` (its `B2`). `human_episode` writes that dialogue as the environment would
have played it: the environment's opening, then the human turns (a turn is a maximal run of one
speaker's utterances, joined by spaces; `B4` 0 is the persuader, the agent, and 1 the persuadee, the
simulator), the first `max_turns` of each role, and then the closing question with an answer made from
the participant's real donation `B6` (`closing_answer`, in a form `p4g_donations.extract_answer` reads
back). So a persuadee trained on these episodes sees the persona card, prompt and closing question of
the environment, and learns to end with the donation the person actually made.

Personas without a valid donation, or whose dialogue is missing from the file, have no episode; they
are counted (`HumanDialogues.skipped`). The split is the environment's (a hash of the participant id):
"train" is every participant the environment does not hold out.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.envs.p4g import CLOSING_QUESTION, P4GEnv, Persona
from scope_jax.envs.p4g_csv import P4GDataError, read_rows

DIALOG_FILE = "FullData/full_dialog.csv"
DIALOG_COLUMNS = ("Unit", "B4", "B2")
SPEAKERS = {"0": AGENT, "1": SIM}


def load_turns(data_dir: str | pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    """{dialogue id: [(role, text) per turn]} from `data_dir`/FullData/full_dialog.csv, in row order."""
    path = pathlib.Path(data_dir) / DIALOG_FILE
    rows = [row for _, row in read_rows(path, DIALOG_COLUMNS)]
    unknown = sorted({row["B4"] for row in rows} - set(SPEAKERS))
    if unknown:
        raise P4GDataError(f"P4G data file {path} has speaker code(s) {', '.join(unknown)} in column B4 "
                           "(0 persuader, 1 persuadee)")
    dialogues = {}
    for dialogue, utterances in itertools.groupby(rows, key=lambda row: row["B2"]):
        dialogues[dialogue] = [(SPEAKERS[code], " ".join(r["Unit"].strip() for r in run))
                               for code, run in itertools.groupby(utterances, key=lambda row: row["B4"])]
    return dialogues


def closing_answer(donation: float) -> str:
    """The persuadee's answer to the closing question for a donation of `donation` dollars."""
    return f"I donate ${donation:.2f}."


def human_episode(env: P4GEnv, persona: Persona, turns: list[tuple[str, str]], max_turns: int) -> Episode:
    """The persona's dialogue: the opening, its first `max_turns` turns per role (stopping at the first
    turn of a role that has used them up, as the environment's turn cap does), the closing question, and
    the answer with the persona's real donation."""
    episode = Episode(persona, group=0)
    episode.messages.extend(env.opening(persona))
    for role, text in turns:
        if episode.turns_taken.get(role, 0) == max_turns:
            break
        episode.messages.append(Message(role, text))
        episode.turns_taken[role] = episode.turns_taken.get(role, 0) + 1
    episode.messages += [Message(ENV, CLOSING_QUESTION, visible_to=(SIM,)),
                         Message(SIM, closing_answer(persona.donation))]
    return episode


@dataclasses.dataclass(frozen=True)
class HumanDialogues:
    """The episodes of one split, and how many of its personas had none (no valid donation, no dialogue)."""

    episodes: list[Episode]
    skipped: dict[str, int]

    @classmethod
    def load(cls, env: P4GEnv, split: str, max_turns: int) -> "HumanDialogues":
        if split not in env.splits:
            raise ValueError(f"unknown split {split!r}; one of {', '.join(env.splits)}")
        turns = load_turns(env.data_dir)
        episodes, skipped = [], {"no_donation": 0, "no_dialogue": 0}
        for persona in env.splits[split]:
            if persona.donation is None:
                skipped["no_donation"] += 1
            elif persona.dialogue not in turns:
                skipped["no_dialogue"] += 1
            else:
                episodes.append(human_episode(env, persona, turns[persona.dialogue], max_turns))
        return cls(episodes, skipped)
