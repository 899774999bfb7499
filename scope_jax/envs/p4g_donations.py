"""Donations stated in a P4G persuadee's text: what a careful reader would take as its donation, in dollars.

Three outcomes: an amount (a statement of this person's donation, $0 to MAX_DONATION), UNREADABLE (a
statement of a donation whose amount cannot be taken as one: above MAX_DONATION, below $0 ("-$1",
"$-1", "minus one dollar", "negative 50 cents"), in scientific notation ("$1e5"), a range or
alternatives ("0 to 2 dollars", "$1 or $1.25", "$0.50-$1", "a dollar or two", "$2 minus 50 cents"), or
only an example, "I'd give, say, $1"), and None (no statement of a donation). UNREADABLE is NaN, so that
statistics over donations can leave it out.

A statement is a donation word (donate, give, contribute, pledge, offer, spare, chip in, make it, ...)
followed within a few words of the same clause by an amount: "$1.50", "$.50", "1 dollar", "50 cents",
"50c", "a dollar", "fifty cents", "a dollar fifty", "1 dollar and 50 cents", "nothing". Amounts that are
not the donation are skipped: negated statements ("I won't give $1"), someone else's ("would you give
$1?", "you asked me to donate $1"), offers that match the partner's own donation ("if you give $1, I'll
give $1 too"), stories ("I gave $5 last week"), habits ("I usually donate $1"), and amounts after
"of / from / than / out" ("half of my $2", "more than $1"). The last statement in a text wins.
"""

from __future__ import annotations

import math
import re

from scope_jax.envs.p4g_csv import MAX_DONATION

UNREADABLE = math.nan


def readable(amount: float | None) -> bool:
    """Whether an extracted outcome is an amount (not None, not UNREADABLE)."""
    return amount is not None and not math.isnan(amount)


_SENTENCE = re.compile(r"[!?;\n]|\.(?!\d)")
_CLAUSE = re.compile(r"(?<!\d),|,(?!\d{3})|\b(?:but|because|since|although|though|however|whereas|so|if|"
                     r"unless|while|when|after|before)\b")
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_EXPONENT = rf"(?:{_NUMBER})e[+-]?\d+"
# a minus sign: "-" or U+2212 right before "$" or a number, not after a word or a dash ("$0.50-$1",
# "covid-19", "donate--$1", "$1 - that's it")
_MINUS_SIGN = r"(?<![a-z\d-])[-\u2212](?=\$|\.?\d)"
_TOKEN = re.compile(rf"{_EXPONENT}|{_NUMBER}|[a-z]+(?:'[a-z]+)?|[$¢]|{_MINUS_SIGN}")
_MINUS = {"-", "\u2212", "minus", "negative"}
_VERB = re.compile(r"donat(?:e|es|ed|ing|ion|ions)|giv(?:e|es|ing|en)|gave|contribut(?:e|es|ed|ing|ion)|"
                   r"pledg(?:e|es|ed|ing)|offer(?:s|ed|ing)?|spare|spared|sparing")
_VERB_PHRASES = (("chip", "in"), ("chipping", "in"), ("count", "me", "in", "for"),
                 ("put", "me", "down", "for"), ("make", "it"))
_NEGATION = {"not", "no", "never", "cannot", "unable", "refuse", "nor", "neither"}
# "don't mind giving", "can't wait to donate", "wouldn't hesitate", "not only", "no problem"
_NOT_NEGATING = {"mind", "hesitate", "wait", "only", "problem"}
_OTHERS = set("you you'd you'll you're you've your they they'd they'll they're their he he'd he'll he's "
              "his she she'd she'll she's people everyone someone others anyone somebody charity "
              "organization organisation children kids friend friends family husband wife".split())
_SELF = {"i", "i'll", "i'd", "i'm", "i've", "we", "we'll", "we'd", "me", "my", "let's"}
_PAST = {"yesterday", "ago", "previously"}
_PAST_AFTER_LAST = {"week", "month", "year", "time", "night", "christmas"}
_REQUESTS = {"ask", "asks", "asked", "asking", "want", "wants", "wanted", "tell", "tells", "told", "urge",
             "urged", "expect", "expects", "expected", "need", "needs", "needed", "convince", "persuade",
             "persuaded", "convinced", "like"}
_ASIDE = re.compile(r",\s*say\s*,")
_DETERMINERS = {"my", "the", "your", "this", "that", "our"}
# "all of my $2", "a donation of $2": still the donation
_DONATION_OF = {"all", "amount", "total", "sum", "entire", "entirety", "full", "donation", "contribution",
                "gift", "pledge", "offer"}
_FILLER = set("maybe about around roughly just only probably perhaps ok okay sure um uh well hmm i i'd "
              "i'll think guess say the amount is will be yes exactly approximately like my answer it it's "
              "that that's would go with for please thanks thank you total".split())
_DOLLARS = {"dollar", "dollars", "buck", "bucks", "usd", "$"}
_CENTS = {"cent", "cents", "c", "¢"}
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
         "ninety": 90}
_WORD_NUMBERS = {**{w: i for i, w in enumerate(_ONES)}, **_TENS}
_ZERO = {"nothing", "none"}
# between two amounts, or a number and an amount, they make a range or alternatives, not one donation
_RANGE_WORDS = {"to", "or", "and", "-", "minus", "plus"}
_HABITUAL = {"usually", "normally", "often", "sometimes", "typically", "generally", "regularly"}
WINDOW = 6  # an amount counts for a donation verb when it starts within this many words after it


def extract_donation(text: str) -> float | None:
    """The donation `text` states: dollars, UNREADABLE, or None if it states none (see the module)."""
    found = None
    for sentence in _sentences(text):
        words = _TOKEN.findall(sentence)
        if _is_story(words) or _matches_someone_else(words):
            continue
        for clause in _CLAUSE.split(sentence):
            value = _clause_donation(_TOKEN.findall(clause))
            if value is not None:
                found = value
    return _outcome(found)


def extract_answer(text: str) -> float | None:
    """The donation stated in an answer to the closing question: as `extract_donation`, or else the last
    clause that is a bare amount with nothing around it but filler ("$1", "Maybe 50 cents.", "I'd say one
    dollar", "$0.25 is the amount")."""
    stated = extract_donation(text)
    if stated is not None:
        return stated
    found = None
    for sentence in _sentences(text):
        for clause in _CLAUSE.split(sentence):
            words = _TOKEN.findall(clause)
            for start in range(len(words)):
                amount = _amount(words, start)
                if amount is not None and set(words[:start] + words[start + amount[1]:]) <= _FILLER:
                    found = amount[0]
    return _outcome(found)


def _sentences(text: str) -> list[str]:
    """Lower-cased sentences, an aside ", say," ("for example") kept in its clause."""
    return _SENTENCE.split(_ASIDE.sub(" say ", text.lower().replace("\u2019", "'")))


def _outcome(found: float | None) -> float | None:
    return UNREADABLE if found is not None and found > MAX_DONATION else found


def _is_story(words: list[str]) -> bool:
    """Whether a sentence tells of the past ("yesterday", "last year", "used to"): not this donation."""
    pairs = set(zip(words, words[1:]))
    return bool(_PAST & set(words)) or ("used", "to") in pairs or any(
        first == "last" and second in _PAST_AFTER_LAST for first, second in pairs)


def _matches_someone_else(words: list[str]) -> bool:
    """Whether a sentence makes its offer depend on another person's donation ("if you give $1, I'll give
    $1 too"): no donation of its own yet."""
    for i, word in enumerate(words[:-1]):
        if word in ("if", "unless") and words[i + 1] in _OTHERS:
            if any(_verb_length(words, j) for j in range(i + 2, min(i + 5, len(words)))):
                return True
    return False


def _clause_donation(words: list[str]) -> float | None:
    """The last donation stated in one clause's words (UNREADABLE for an example or a range's end)."""
    found = None
    for i in range(len(words)):
        length = _verb_length(words, i)
        if not length or _negated(words[:i]) or _by_someone_else(words[:i]) or _HABITUAL & set(words[:i]):
            continue
        after = i + length
        for start in range(after, min(after + WINDOW, len(words))):
            amount = _amount(words, start)
            if amount is not None:
                if not _of_something_else(words[i:start]):
                    dollars, used = amount
                    vague = "say" in words[after:start] or _in_range(words, start, start + used, dollars)
                    found = UNREADABLE if vague else dollars
                break
    return found


def _verb_length(words: list[str], i: int) -> int:
    """Words in the donation verb (phrase) starting at words[i]; 0 if none starts there."""
    for phrase in _VERB_PHRASES:
        if tuple(words[i:i + len(phrase)]) == phrase:
            return len(phrase)
    return int(bool(_VERB.fullmatch(words[i])))


def _negated(before: list[str]) -> bool:
    """Whether the words before a verb (in its clause) negate it."""
    for j, word in enumerate(before):
        negation = word in _NEGATION or word.endswith("n't")
        if negation and (j + 1 == len(before) or before[j + 1] not in _NOT_NEGATING):
            return True
    return False


def _by_someone_else(before: list[str]) -> bool:
    """Whether the verb's nearest subject before it is another person ("you", "they", the charity...); "me"
    after a request ("you asked me to donate") is the request's object, not a subject."""
    subjects = [w for j, w in enumerate(before) if (w in _OTHERS or w in _SELF)
                and not (w == "me" and j and before[j - 1] in _REQUESTS)]
    return bool(subjects) and subjects[-1] in _OTHERS


def _in_range(words: list[str], start: int, end: int, dollars: float) -> bool:
    """Whether the amount of `dollars` in words[start:end] is one end of a range or one of alternatives: a
    different number or amount right before or after it, alone or across "to", "or", "and", "-", "minus",
    "plus" ("0 to 2 dollars", "1-2 dollars", "$1 or $1.25"); a bare number after it only at the clause's end
    ("a dollar or two", but "$1 to 2 charities" is $1). The same amount again is a restatement ("$0.20
    (twenty cents)", "donate 2 ($2)")."""
    def differs(value: float) -> bool:
        return not any(math.isclose(value, same) for same in (dollars, dollars * 100))

    other = start - 1 - (words[start - 1] in _RANGE_WORDS)
    number = _number_at(words[other:other + 1], 0)
    if number is not None and differs(number[0]):
        return True
    other = end + (end < len(words) and words[end] in _RANGE_WORDS)
    amount = _amount(words, other) if other < len(words) else None
    number = _number_at(words, other) if other + 1 == len(words) else None
    return any(found is not None and differs(found[0]) for found in (amount, number))


def _of_something_else(lead: list[str]) -> bool:
    """Whether the words from a verb up to an amount make the amount something else than the donation: it
    follows "from", "than", "out" or "of" ("half of my $2"; but "all of my $2", "a donation of $2" are it)."""
    words = [w for w in lead if w not in _DETERMINERS]
    if words[-1] not in ("of", "from", "than", "out"):
        return False
    return not (words[-1] == "of" and len(words) > 1 and words[-2] in _DONATION_OF)


def _amount(words: list[str], i: int) -> tuple[float, int] | None:
    """(dollars, words used) of the amount starting at words[i], or None (UNREADABLE below $0)."""
    if words[i] in _MINUS:
        amount = _amount(words, i + 1) if i + 1 < len(words) else None
        return None if amount is None else (UNREADABLE, amount[1] + 1)
    if words[i] in _ZERO:
        return 0.0, 1
    if words[i] == "$":
        number = _number_at(words, i + 1)
        return None if number is None else _add_cents(words, i + 1 + number[1], number[0], 1 + number[1])
    if words[i:i + 3] == ["half", "a", "dollar"]:
        return 0.5, 3
    number = _number_at(words, i, article=True)
    unit = words[i + number[1]] if number is not None and i + number[1] < len(words) else None
    if unit in _DOLLARS:
        return _add_cents(words, i + number[1] + 1, number[0], number[1] + 1)
    if unit in _CENTS:
        return number[0] / 100, number[1] + 1
    return None


def _add_cents(words: list[str], i: int, dollars: float, used: int) -> tuple[float, int]:
    """Dollars, plus the cents of a following "and 50 cents" or bare "fifty" ("a dollar fifty")."""
    if words[i:i + 1] == ["and"]:
        cents = _number_at(words, i + 1)
        if cents is not None and words[i + 1 + cents[1]:i + 2 + cents[1]] in (["cents"], ["cent"]):
            return dollars + cents[0] / 100, used + cents[1] + 2
    if i < len(words) and words[i] in _WORD_NUMBERS:
        cents = _number_at(words, i)
        if i + cents[1] == len(words) or words[i + cents[1]] not in _DOLLARS | _CENTS:
            return dollars + cents[0] / 100, used + cents[1]
    return dollars, used


def _number_at(words: list[str], i: int, article: bool = False) -> tuple[float, int] | None:
    """(value, words used) of a number at words[i]: digits, or number words up to 99 ("twenty five");
    with `article`, "a" / "an" before "dollar" / "buck" read as one; UNREADABLE below 0 ("$-1") or in
    scientific notation."""
    if i >= len(words):
        return None
    word = words[i]
    if word in _MINUS:
        number = _number_at(words, i + 1)
        return None if number is None else (UNREADABLE, number[1] + 1)
    if re.fullmatch(_EXPONENT, word):
        return UNREADABLE, 1
    if re.fullmatch(_NUMBER, word):
        return float(word.replace(",", "")), 1
    if article and word in ("a", "an") and words[i + 1:i + 2] in (["dollar"], ["buck"]):
        return 1.0, 1
    if word in _TENS and i + 1 < len(words) and words[i + 1] in _ONES[1:10]:
        return float(_TENS[word] + _ONES.index(words[i + 1])), 2
    if word in _WORD_NUMBERS:
        return float(_WORD_NUMBERS[word]), 1
    return None
