"""P4G with LLM players: donation extraction (a hand-written table with traps), personas and their split,
data errors, the closing question in the turn loop, and rewards (an unreadable donation is its own
outcome)."""

import csv
import math
import pathlib

import jax
import numpy as np
import pytest

from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player
from scope_jax.envs import make
from scope_jax.envs import p4g
from scope_jax.envs.p4g_donations import UNREADABLE, extract_answer, extract_donation
from scope_jax.sampling import SamplingConfig
from scope_jax.training.players import load_model

DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "p4g"

# (persuadee's text, the donation it states: dollars, UNREADABLE, or None for no statement)
STATEMENTS = [
    # plain statements, in the forms the amount takes
    ("I will donate $1.", 1.0),
    ("Sure, I'll donate $0.50 to Save the Children.", 0.5),
    ("I can give $.50", 0.5),
    ("Okay, I'd like to contribute 1 dollar.", 1.0),
    ("I will donate 0.5 dollars.", 0.5),
    ("I'll give 2 bucks.", 2.0),
    ("I'm willing to donate 50 cents.", 0.5),
    ("I can spare 50c", 0.5),
    ("I'll contribute 50¢.", 0.5),
    ("I will donate 1$", 1.0),
    ("My donation will be $1.25.", 1.25),
    ("Count me in for $1!", 1.0),
    ("I pledge $0.75.", 0.75),
    ("I'd be happy to chip in $1.", 1.0),
    ("I'll donate the full $2.", 2.0),
    ("I'll donate all of my $2!", 2.0),
    ("I would like to donate $1.00 of my $2.00 payment.", 1.0),
    ("I'll give you a donation of $2.", 2.0),
    ("I donated a total of $2 to the Save the Children charity.", 2.0),
    ("I've donated a $2 to Save the Children.", 2.0),
    ("I'll donate nothing.", 0.0),
    ("I will donate $0 this time.", 0.0),
    # words for numbers
    ("I'll give a dollar.", 1.0),
    ("I can give one dollar", 1.0),
    ("I will donate two dollars", 2.0),
    ("I can give twenty-five cents", 0.25),
    ("I'll donate fifty cents to the kids.", 0.5),
    ("I'll give a dollar fifty.", 1.5),
    ("I will donate 1 dollar and 50 cents", 1.5),
    ("I'll give half a dollar.", 0.5),
    # above the $2 the persuadee has: not an amount that can be its donation
    ("I'll donate $5", UNREADABLE),
    ("I'll donate 1,000 dollars", UNREADABLE),
    ("I will donate $1. Actually, make it $5.", UNREADABLE),
    # below $0, or in scientific notation: not an amount that can be its donation either
    ("I'll donate -$1.", UNREADABLE),
    ("I'll donate $-1.", UNREADABLE),
    ("I'll donate -1 dollars.", UNREADABLE),
    ("I'll donate \u2212$0.50.", UNREADABLE),
    ("I will give minus one dollar", UNREADABLE),
    ("I can give negative 50 cents.", UNREADABLE),
    ("I'll donate $1e5", UNREADABLE),
    ("I'll donate $1.5E-1.", UNREADABLE),
    # a range or alternatives: no one amount
    ("It says that I can donate 0 to 2 dollars", UNREADABLE),
    ("I think I'll probably donate $1 or $1.25", UNREADABLE),
    ("I'll donate $0.50-$1.", UNREADABLE),
    ("I'll donate 1-2 dollars.", UNREADABLE),
    ("I can give one or two dollars", UNREADABLE),
    ("I can give a dollar or two", UNREADABLE),
    ("I'll give between $1 and $2.", UNREADABLE),
    ("I'll donate $2 minus 50 cents.", UNREADABLE),
    ("I'll donate $1 to 2 charities.", 1.0),
    ("I'll donate $1 and that's final.", 1.0),
    ("Ok, I'll make a donation of $0.20 (twenty cents).", 0.2),  # the same amount restated
    ("I would be glad to donate 2 ($2)", 2.0),
    ("I will donate .10    ten cents", 0.1),
    # dashes and hyphens that are no minus sign
    ("I'll give $1 - that's it.", 1.0),
    ("I'll donate--$1.", 1.0),
    ("It's tax-deductible, so I'll donate $1.50.", 1.5),
    ("I'll donate $1 to the covid-19 fund.", 1.0),
    # only an example of an amount
    ("I'd give, say, $1", UNREADABLE),
    # the last statement wins
    ("I will donate $1. Actually, make it $2.", 2.0),
    ("I'll donate $2... no wait, I'll donate $1.", 1.0),
    ("I won't give $1, but I'll give 50 cents.", 0.5),
    # negation
    ("I won't give $1", None),
    ("I will not donate $2.", None),
    ("I can't donate even 50 cents, sorry.", None),
    ("I don't think I'll give $1.", None),
    ("No, I would never donate $2.", None),
    ("I don't mind donating $1", 1.0),
    ("I wouldn't hesitate to give $0.50.", 0.5),
    ("No problem, I'll donate $1.", 1.0),
    # amounts that are not the donation
    ("I only make $2 for this task.", None),
    ("I earned $2 for this, so I'll donate $0.50.", 0.5),
    ("I'll give it some thought, I have 2 dollars.", None),
    ("Each $1 donated buys a meal.", None),
    ("I'll donate half of my $2.", None),
    ("I'm donating 20% of the $2.", None),
    ("I can't give more than $1.", None),
    ("I'll give it a try.", None),
    ("I'll give you 5 stars.", None),
    ("Give me a reason to donate.", None),
    # someone else's donation
    ("Would you donate $1?", None),
    ("I think you should donate $2.", None),
    ("Otherwise you'd have offered me nothing.", None),
    ("You asked me to donate $1", None),  # a quoted request
    ("Would you like me to give $1?", None),
    ("If you give $1, I'll give $1 too.", None),  # an offer that waits for the partner's own donation
    ("I'll donate $1 if you want.", 1.0),  # a condition, but not a matching offer
    ("I can't believe how easy it is to donate $1", None),
    ("Save the Children gives $10 to families.", None),
    ("The amount of your donation is $2.", None),
    ("My friend donates $2 every month.", None),
    # stories about the past
    ("I gave $5 to a homeless man last week.", None),
    ("I donated $20 to the Red Cross two years ago.", None),
    ("I used to give $1 to my church.", None),
    # habits
    ("I usually donate $1.00 or $2.00 at restaurants", None),
    ("I normally give $1 at the checkout, but today I'll give 50 cents.", 0.5),
    ("I often donate $2. I'll donate $1 today.", 1.0),
    # no amount at all
    ("I'd love to donate!", None),
    ("How much should I donate?", None),
    ("", None),
]

# (answer to the closing question, the donation it states)
ANSWERS = [
    ("I donate $1.", 1.0),
    ("$1", 1.0),
    ("$0.50.", 0.5),
    ("Maybe 50 cents.", 0.5),
    ("I'd say one dollar!", 1.0),
    ("Nothing.", 0.0),
    ("$0", 0.0),
    ("I'd rather keep my $2.", None),
    ("$2 is a lot of money for me.", None),
    ("Not $1, sorry.", None),
    ("$0.25 is the amount, not $2.", 0.25),
    ("That's 25 cents. I'll send it to them.", 0.25),
    ("$2.50 to $5.00.", None),
    ("$0.50-$1", None),
    ("-$1", UNREADABLE),
    ("$1e0", UNREADABLE),
    ("$5", UNREADABLE),
    ("I'm not sure.", None),
]


def same(found, expected) -> bool:
    return found is expected is None or (found is not None and expected is not None and (
        math.isnan(found) and math.isnan(expected) or found == expected))


@pytest.mark.parametrize("text,expected", STATEMENTS)
def test_extract_donation(text, expected):
    assert same(extract_donation(text), expected), extract_donation(text)


@pytest.mark.parametrize("text,expected", ANSWERS)
def test_extract_answer_to_the_closing_question(text, expected):
    assert same(extract_answer(text), expected), extract_answer(text)


# --- a toy data file -----------------------------------------------------------------------------------

def _row(participant: str, role: str = "1", donation: str = "0.5", **overrides) -> dict[str, str]:
    row = {column: "3.0" for column in p4g.REQUIRED_COLUMNS}
    row.update({"B2": "d1", "B3": participant, "B4": role, "B6": donation, "age.x": "30.0", "sex.x": "Female",
                "race.x": "White", "edu.x": "Postgraduate", "marital.x": "Married",
                "employment.x": "Employed for wages", "religion.x": "Atheist", "ideology.x": "Liberal",
                "extrovert.x": "4.5", "care.x": "5.5", "power.x": "1.0"})
    row.update(overrides)
    return row


def write_info(folder: pathlib.Path, rows: list[dict[str, str]], columns=None) -> pathlib.Path:
    path = folder / p4g.INFO_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = columns or list(p4g.REQUIRED_COLUMNS)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return folder


@pytest.fixture
def toy_data(tmp_path):
    rows = [_row(f"user_{i}", donation=str(i % 3 * 0.5)) for i in range(40)] + [_row("user_x", role="0")]
    return write_info(tmp_path, rows)


def test_toy_personas_cards_and_split(toy_data):
    env = p4g.P4GEnv(data_dir=str(toy_data), heldout_fraction=0.25)
    assert len(env.personas) == 40 and all(p.participant != "user_x" for p in env.personas)  # persuadees only
    train, held = {p.participant for p in env.splits["train"]}, {p.participant for p in env.splits["eval"]}
    assert not train & held and len(train | held) == 40 and 4 <= len(held) <= 18
    again = p4g.P4GEnv(data_dir=str(toy_data), heldout_fraction=0.25)
    assert [p.participant for p in again.splits["eval"]] == [p.participant for p in env.splits["eval"]]
    other_seed = p4g.P4GEnv(data_dir=str(toy_data), heldout_fraction=0.25, split_seed=1)
    assert {p.participant for p in other_seed.splits["eval"]} != held
    card = p4g.persona_card(env.personas[0])
    assert card.startswith("You are a 30-year-old woman, white, with a postgraduate degree, married")
    assert "outgoing" in card and "caring for people who suffer" in card and "status least" in card
    scenarios = env.sample_scenarios(5, np.random.default_rng(0), "eval")
    assert {p.participant for p in scenarios} <= held
    assert card in env.system_prompt(env.personas[0], SIM)
    assert "$2" in env.system_prompt(env.personas[0], AGENT)


@pytest.mark.parametrize("settings,message", [
    ({"heldout_fraction": 1.5}, "P4G heldout_fraction is 1.5; it must be in [0, 1)"),
    ({"judge_fraction": float("nan")}, "P4G judge_fraction is nan; it must be in [0, 1)"),
    ({"heldout_fraction": 0.97}, "P4G split 'train' is empty"),  # every toy score is below 0.97
    ({"judge_fraction": 0.0}, "P4G split 'judge' is empty"),
    ({"judge_fraction": 0.95, "train_split": "simulator"}, "P4G split 'simulator' is empty"),
])
def test_fractions_outside_0_1_and_empty_splits_are_refused(toy_data, settings, message):
    with pytest.raises(ValueError) as error:
        p4g.P4GEnv(data_dir=str(toy_data), **settings)
    assert str(error.value).startswith(message), error.value


def test_invalid_donations_and_missing_traits_are_none(tmp_path):
    rows = [_row("a", donation="50.0", **{"age.x": "", "sex.x": ""}), _row("b", donation="")]
    folder = write_info(tmp_path, rows)
    personas = p4g.load_personas(folder)
    assert [p.donation for p in personas] == [None, None]
    assert dict(personas[0].traits)["age"] is None
    assert p4g.persona_card(personas[0]).startswith("You are an adult person")


@pytest.mark.parametrize("breakage,message", [
    ("missing", "full_info.csv is missing"),
    ("column", "lacks the column(s) B6"),
    ("value", "line 3: column care.x holds 'high', not a number"),
    ("no_persuadees", "has no persuadee rows"),
    ("binary", "line 1: 'utf-8' codec can't decode"),
])
def test_data_errors_are_one_line_naming_the_file(tmp_path, breakage, message):
    if breakage == "column":
        write_info(tmp_path, [_row("a")], columns=[c for c in list(p4g.REQUIRED_COLUMNS) if c != "B6"])
    elif breakage == "value":
        write_info(tmp_path, [_row("a"), _row("b", **{"care.x": "high"})])
    elif breakage == "no_persuadees":
        write_info(tmp_path, [_row("a", role="0")])
    elif breakage == "binary":
        (tmp_path / p4g.INFO_FILE).parent.mkdir(parents=True)
        (tmp_path / p4g.INFO_FILE).write_bytes(b"\xff\xfe\x00B2,B3\n")
    with pytest.raises(p4g.P4GDataError) as error:
        p4g.P4GEnv(data_dir=str(tmp_path))
    assert message in str(error.value) and str(tmp_path / p4g.INFO_FILE) in str(error.value)
    assert "\n" not in str(error.value)


def test_run_stops_with_one_line_naming_the_file(tmp_path):
    from experiments.run import prepare
    from scope_jax.config import ConfigError
    from scope_jax.training.config import default_config, env_settings

    config = default_config()
    config.env = env_settings("p4g")
    config.env.data_dir = str(tmp_path / "nowhere")
    message = r"config key 'env.data_dir': P4G data file .*nowhere/FullData/full_info.csv is missing$"
    with pytest.raises(ConfigError, match=message):
        prepare(config)


# --- rewards and the closing question ------------------------------------------------------------------

def episode(*texts: str, closing_answer: str | None = None) -> Episode:
    """Alternating persuader / persuadee texts, optionally closed by the question and an answer."""
    e = Episode(scenario=None, group=0)
    e.messages = [Message(AGENT if i % 2 == 0 else SIM, t) for i, t in enumerate(texts)]
    if closing_answer is not None:
        e.messages += [Message(ENV, p4g.CLOSING_QUESTION, visible_to=(SIM,)), Message(SIM, closing_answer)]
    return e


def test_rewards_last_statement_wins_and_closing_answers_are_read(toy_data):
    env = p4g.P4GEnv(data_dir=str(toy_data), unreadable_reward=-0.1)
    stated = episode("Please donate.", "I'll donate $2.", "Thanks!", "Hmm, actually I'll donate $0.50.")
    assert env.rewards(stated) == {"agent": 0.25, "sim": 0.25, "donation": 0.5, "success": 1.0,
                                   "unreadable": 0.0}
    assert env.closing(stated) == []
    nothing = episode("Please donate.", "Nothing.", closing_answer="I'd rather keep it.")
    assert env.rewards(nothing)["unreadable"] == 1.0
    refused = episode("Please donate.", "I'll donate nothing.")
    assert env.rewards(refused) == {"agent": 0.0, "sim": 0.0, "donation": 0.0, "success": 0.0,
                                    "unreadable": 0.0}
    silent = episode("Please donate.", "Maybe later.")
    (question,) = env.closing(silent)
    assert question.role == ENV and question.visible_to == (SIM,)
    unread = env.rewards(silent)  # no amount read is not $0: its own outcome, with the configured reward
    assert (unread["agent"], unread["sim"], unread["unreadable"]) == (-0.1, -0.1, 1.0)
    assert math.isnan(unread["donation"]) and math.isnan(unread["success"])
    answered = episode("Please donate.", "Maybe later.", closing_answer="$1.50")
    assert env.rewards(answered)["donation"] == 1.5
    too_much = episode("Please donate.", "I'll donate $5.")  # unreadable: asked again at the end
    assert len(env.closing(too_much)) == 1 and env.rewards(too_much)["unreadable"] == 1.0
    # a bare amount counts only as an answer to the closing question
    assert env.rewards(episode("Please donate.", "$1.50"))["unreadable"] == 1.0


def test_closing_question_gets_one_extra_simulator_turn(toy_data):
    """Tiny random models never state a donation, so every episode ends with the question and an answer that
    only the persuadee sees; both roles' training views still hold every prompt they sampled from."""
    env = make("p4g", data_dir=str(toy_data), max_turns=2)
    graphdef, params, tokenizer = load_model("tiny:0", words=("donate", "$", "1", "I", "no"))
    sampling = SamplingConfig(max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,),
                              pad_token_id=tokenizer.pad_token_id)
    speaker = ModelSpeaker(Player(graphdef, params, tokenizer, sampling, max_context=4096))
    episodes = [Episode(s, group=i) for i, s in enumerate(env.sample_scenarios(3, np.random.default_rng(0)))]
    rollout(env, episodes, {AGENT: speaker, SIM: speaker}, jax.random.key(0))
    for e in episodes:
        roles = [m.role for m in e.messages]
        assert roles == [ENV, AGENT, SIM, AGENT, SIM, ENV, SIM] and e.end_reason == "turn_limit"
        assert e.messages[-1].sampled_ids is not None and e.rewards["unreadable"] == 1.0
        # the persuadee's view holds the question only it saw, and its answer
        question = tokenizer(p4g.CLOSING_QUESTION, add_special_tokens=False).input_ids
        sim = e.views[SIM].ids
        assert any(sim[i:i + len(question)] == question for i in range(len(sim)))
        assert len(e.views[AGENT].prompt_lengths) == 2 and len(e.views[SIM].prompt_lengths) == 3


# --- the real data -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_env():
    if not (DATA / p4g.INFO_FILE).exists():
        pytest.skip(f"P4G data folder absent ({DATA}); the real personas cannot be checked")
    return p4g.P4GEnv(data_dir=str(DATA))


def test_real_personas_match_the_published_donation_statistics(real_env):
    donations = np.array([p.donation for p in real_env.personas if p.donation is not None])
    assert len(real_env.personas) == 1017 and len(donations) == 982
    assert donations.mean() == pytest.approx(0.35, abs=0.005)
    assert (donations > 0).mean() == pytest.approx(0.519, abs=5e-4)
    held = {p.participant for p in real_env.splits["eval"]}
    assert not held & {p.participant for p in real_env.splits["train"]}
    assert 0.15 < len(real_env.splits["eval"]) / 1017 < 0.25
    cards = [p4g.persona_card(p) for p in real_env.personas]
    participants = {p.participant for p in real_env.personas}  # 761: some took part more than once
    assert len(set(cards)) > 0.95 * len(participants) and not any("None" in c for c in cards)
    assert max(len(c.split()) for c in cards) < 90
