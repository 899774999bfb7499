"""The simulator side by Verbalized Sampling, as a speaker of the dialogue loop.

At each simulator turn the simulator's system prompt is replaced by the Verbalized Sampling request
(`build_prompt`: k candidate replies with probabilities, up to `max_new_tokens` tokens); one candidate is
drawn and only its text enters the dialogue. Unparsable answers are retried and then replaced by direct
sampling from the plain prompt. Each turn's record (p_max, entropy, candidates kept, attempts, parse
failures, fallback) goes to episode.info["verbalized"], so every statistic of a step is derived from
its episodes (`verbalized.summarize`).

Both prompts go through the player's context check like every other turn: an episode whose verbalized
prompt plus its budget, or whose direct prompt plus the direct budget, does not fit ends there.
The prompts are rendered afresh each turn (the simulator does not train in this mode, so no view of
them is kept).
"""

from __future__ import annotations

import dataclasses

import jax

from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import Episode, Message
from scope_jax.dialogue.speakers import Player, reply_text, sample_replies
from scope_jax.dialogue.views import prompt_ids
from scope_jax.sampling import SamplingConfig
from scope_jax.simulators.verbalized import VerbalizedSampler, build_prompt


def generate_texts(player: Player, prompts: list[tuple[int, ...]], key: jax.Array,
                   sampling: SamplingConfig) -> list[str]:
    """The replies' texts of one batched generate call."""
    return [reply_text(player.tokenizer, s) for s in sample_replies(player, prompts, key, sampling)]


@dataclasses.dataclass(frozen=True)
class VerbalizedSpeaker:
    player: Player
    sampler: VerbalizedSampler
    max_new_tokens: int  # the budget of a verbalized answer (k candidates)

    def __call__(self, env: Environment, role: str, episodes: list[Episode],
                 key: jax.Array) -> list[Message | None]:
        player, config = self.player, self.sampler.config
        instructions = [env.system_prompt(e.scenario, role) for e in episodes]
        verbalized = [prompt_ids(player.tokenizer, build_prompt(text, config), e.messages, role)
                      for text, e in zip(instructions, episodes)]
        direct = [prompt_ids(player.tokenizer, text, e.messages, role)
                  for text, e in zip(instructions, episodes)]
        live = [i for i in range(len(episodes))
                if player.fits(len(verbalized[i]), self.max_new_tokens) and player.fits(len(direct[i]))]
        budget = dataclasses.replace(player.sampling, max_new_tokens=self.max_new_tokens)
        attempt_key, direct_key, choice_key = jax.random.split(key, 3)

        def generate(_, attempt: int, rows: list[int]) -> list[str]:
            return generate_texts(player, [verbalized[live[r]] for r in rows],
                                  jax.random.fold_in(attempt_key, attempt), budget)

        def fallback(_, rows: list[int]) -> list[str]:
            return generate_texts(player, [direct[live[r]] for r in rows], direct_key, player.sampling)

        choices = self.sampler.choose_batch([instructions[i] for i in live],
                                            jax.random.split(choice_key, len(live)), generate, fallback)
        replies: list[Message | None] = [None] * len(episodes)
        for i, (text, record) in zip(live, choices):
            episodes[i].info.setdefault("verbalized", []).append(record.metrics())
            replies[i] = Message(role, text)
        return replies
