"""The few Persuasion-for-Good statistics the personas testbed needs, as a small committed table.

The persona game (`scope_jax.envs.personas`) must run on a machine without the data folder, so the
numbers it takes from P4G live in `p4g_stats.json` next to this module. `compute_stats(data_dir)`
recomputes that table from `../shared/data/p4g`; `python -m scope_jax.envs.p4g_stats --data=DIR` prints
it and, with `--write`, rewrites the committed file. A test checks that the two agree whenever the data
folder is present. No utterance text is stored, only counts.

What is counted (Wang et al. 2019, the 300 annotated dialogues, `AnnotatedData/300_dialog.csv`):

* A *turn* is a maximal run of consecutive rows of one speaker in the file's row order (the `Turn`
  column is out of order in 5 dialogues; the rows are not). Each sentence has up to two labels
  (`er_label_1/2` for the persuader, `ee_label_1/2` for the persuadee); both are used.
* `strategy_turns[s]`: the number of persuader turns with at least one sentence labelled with
  strategy s (a turn with two strategies counts for both). `donation_request_turns` counts turns with
  `proposition-of-donation`, the P4G label of the act that asks for the donation.
* `reply_counts[s][u]`: over persuader turns that use strategy s, the number of persuadee sentence
  labels in coarse group u in the persuadee turn that immediately follows (a reply of three sentences
  contributes three counts).
* `donation`: from `FullData/full_info.csv`, the persuadees' actual donation `B6` (dollars), keeping
  the values in [0, 2] (the task's range; 35 of 1,017 fall outside): count, mean, fraction above 0.

Label normalisation (`normalize_label`): lower case, spaces and underscores to hyphens, and the one
variant in the file, `non-personal-Task-related-inquiry`, to `task-related-inquiry`. Persuader
labels outside the 10 strategies and `proposition-of-donation` (greeting, thank, praise-user, ...) are
not counted. Every persuadee label must belong to one of the coarse groups below (an unknown label
raises, so a changed data file cannot be silently miscounted):

    positive        positive-reaction-to-donation, agree-donation, provide-donation-amount, confirm-donation
    negative        negative-reaction-to-donation, disagree-donation, disagree-donation-more,
                    negative-to-inquiry
    neutral         neutral-reaction-to-donation, acknowledgement, greeting, thank, you-are-welcome,
                    closing, off-task, other, task-related-inquiry (about the HIT, not the charity)
    ask_info        ask-org-info, ask-donation-procedure, ask-persuader-donation-intention
    share_personal  positive-to-inquiry, neutral-to-inquiry (answers to the persuader's questions,
                    which mostly tell something about the persuadee), personal-related-inquiry

Agreeing to and refusing a donation mid-dialogue fall under positive and negative: in the game the
donation itself is the episode's end, not a reply act.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
from typing import Any

from scope_jax.envs.p4g_csv import MAX_DONATION, read_rows

STRATEGIES: tuple[str, ...] = (
    "logical-appeal",
    "emotion-appeal",
    "credibility-appeal",
    "foot-in-the-door",
    "self-modeling",
    "personal-story",
    "donation-information",
    "source-related-inquiry",
    "task-related-inquiry",
    "personal-related-inquiry",
)
DONATION_REQUEST = "proposition-of-donation"

USER_GROUPS: dict[str, tuple[str, ...]] = {
    "positive": (
        "positive-reaction-to-donation",
        "agree-donation",
        "provide-donation-amount",
        "confirm-donation",
    ),
    "negative": (
        "negative-reaction-to-donation",
        "disagree-donation",
        "disagree-donation-more",
        "negative-to-inquiry",
    ),
    "neutral": (
        "neutral-reaction-to-donation",
        "acknowledgement",
        "greeting",
        "thank",
        "you-are-welcome",
        "closing",
        "off-task",
        "other",
        "task-related-inquiry",
    ),
    "ask_info": ("ask-org-info", "ask-donation-procedure", "ask-persuader-donation-intention"),
    "share_personal": ("positive-to-inquiry", "neutral-to-inquiry", "personal-related-inquiry"),
}
USER_ACTS: tuple[str, ...] = tuple(USER_GROUPS)
_GROUP_OF = {label: group for group, labels in USER_GROUPS.items() for label in labels}
_ALIASES = {"non-personal-task-related-inquiry": "task-related-inquiry"}

ANNOTATED_FILE = "AnnotatedData/300_dialog.csv"
STATS_PATH = pathlib.Path(__file__).with_name("p4g_stats.json")


def normalize_label(label: str) -> str:
    """Canonical spelling of a P4G label ('' for an empty cell)."""
    label = label.strip().lower().replace(" ", "-").replace("_", "-")
    return _ALIASES.get(label, label)


def _turns(rows: list[dict[str, str]]) -> list[list[tuple[str, list[str]]]]:
    """Per dialogue, its turns as (role "0"/"1", normalised labels of all its sentences)."""
    dialogues = []
    for _, dialogue in itertools.groupby(rows, key=lambda row: row["B2"]):
        turns = []
        for role, sentences in itertools.groupby(dialogue, key=lambda row: row["B4"]):
            columns = ("er_label_1", "er_label_2") if role == "0" else ("ee_label_1", "ee_label_2")
            labels = [normalize_label(s[c]) for s in sentences for c in columns]
            turns.append((role, [label for label in labels if label]))
        dialogues.append(turns)
    return dialogues


def _donations(data_dir: pathlib.Path) -> dict[str, float]:
    values = []
    for _, row in read_rows(data_dir / "FullData" / "full_info.csv", ("B4", "B6")):
        if row["B4"] == "1" and (row["B6"] or "").strip():
            value = float(row["B6"])
            if 0.0 <= value <= MAX_DONATION:
                values.append(value)
    return {
        "count": len(values),
        "mean": round(sum(values) / len(values), 6),
        "fraction_donating": round(sum(v > 0 for v in values) / len(values), 6),
    }


def compute_stats(data_dir: str | pathlib.Path) -> dict[str, Any]:
    """Recompute the table from the P4G folder (the one holding AnnotatedData/ and FullData/)."""
    data_dir = pathlib.Path(data_dir)
    columns = ("B2", "B4", "er_label_1", "er_label_2", "ee_label_1", "ee_label_2")
    dialogues = _turns([row for _, row in read_rows(data_dir / ANNOTATED_FILE, columns)])
    strategy_turns = dict.fromkeys(STRATEGIES, 0)
    reply_counts = {s: dict.fromkeys(USER_ACTS, 0) for s in STRATEGIES}
    request_turns = 0
    for turns in dialogues:
        for (role, labels), following in itertools.zip_longest(turns, turns[1:]):
            if role != "0":
                unknown = [label for label in labels if label not in _GROUP_OF]
                if unknown:
                    raise ValueError(f"persuadee labels without a coarse group: {sorted(set(unknown))}")
                continue
            request_turns += DONATION_REQUEST in labels
            used = [s for s in STRATEGIES if s in labels]
            reply = following[1] if following is not None and following[0] == "1" else []
            for s in used:
                strategy_turns[s] += 1
                for label in reply:
                    reply_counts[s][_GROUP_OF[label]] += 1
    return {
        "source": "Persuasion for Good (Wang et al., ACL 2019, Apache-2.0), by scope_jax/envs/p4g_stats.py",
        "dialogues": len(dialogues),
        "strategies": list(STRATEGIES),
        "user_acts": list(USER_ACTS),
        "strategy_turns": [strategy_turns[s] for s in STRATEGIES],
        "donation_request_turns": request_turns,
        "reply_counts": [[reply_counts[s][u] for u in USER_ACTS] for s in STRATEGIES],
        "donation": _donations(data_dir),
    }


def load_stats(path: str | pathlib.Path = STATS_PATH) -> dict[str, Any]:
    """The committed table (no data folder needed)."""
    with pathlib.Path(path).open() as f:
        return json.load(f)


def _format(stats: dict[str, Any]) -> str:
    """JSON with one key per line and one reply-count row per strategy, so the table reads and diffs well."""

    def value(key: str, v: Any) -> str:
        if key == "reply_counts":
            return "[\n    " + ",\n    ".join(json.dumps(row) for row in v) + "\n  ]"
        return json.dumps(v)

    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {value(k, v)}" for k, v in stats.items()) + "\n}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/p4g", help="the P4G folder")
    parser.add_argument("--write", action="store_true", help=f"rewrite {STATS_PATH.name}")
    args = parser.parse_args(argv)
    text = _format(compute_stats(args.data))
    if args.write:
        STATS_PATH.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
