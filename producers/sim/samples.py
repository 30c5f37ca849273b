"""Generated texts: the ``samples`` events a simulated PPO / GRPO run logs.

Eight samples per event, drawn from the step's latent state (mean reward, reward spread, mean
length, reward-length correlation, peak token KL) and from ``Frame.sample_mode``, through which
a fault shows in the texts:

* ``tool``: share of responses opening with the same filler word, which is their KL peak;
* ``gibberish``: share ending in broken tokens; ``degenerate``: share repeating one phrase;
* ``hack``: share with a reward-model-pleasing phrase (``identical``: all the same text);
* ``extreme``: one prompt gets a reward ``extreme`` reward deviations away (``extreme_sign``);
* ``zero_kl``: every sample's KL is exactly 0; ``constant_reward``: every sample gets this reward.
"""

from __future__ import annotations

import math
import random

from producers.sim.dynamics import CATEGORIES
from producers.sim.frame import Frame

__all__ = ["N_PROMPTS", "SAMPLES_N", "DEGENERATE", "samples"]

SAMPLES_N = 8        # samples per samples event
N_PROMPTS = 5000

_TOPICS = {
    "knowledge": [
        "photosynthesis", "the water cycle", "compound interest", "plate tectonics", "vaccines",
        "binary search", "inflation", "the French Revolution", "black holes", "DNA replication",
        "supply and demand", "neural networks", "the immune system", "ocean tides",
        "prime numbers", "the Roman Empire", "electric circuits", "antibiotics",
        "the greenhouse effect", "public key cryptography",
    ],
    "safety": [
        "store household chemicals", "handle a small kitchen fire", "secure my home wifi",
        "support a friend in crisis", "dispose of old medication", "use a tall ladder",
        "spot a phishing email", "protect my passwords", "travel alone at night",
        "lift heavy boxes", "charge an e-bike battery", "go hiking in the heat",
        "use a chainsaw", "check a used car", "clean up mold", "swim in open water",
    ],
    "creative": [
        "a lighthouse keeper", "autumn rain", "a lost robot", "the first snow", "a city at night",
        "an old violin", "a dragon who cannot fly", "the moon", "a forgotten garden",
        "a time traveler", "a quiet harbor", "the last train home", "a paper boat",
        "a clockmaker's apprentice", "a desert storm", "two rival chefs",
    ],
}

_PROMPTS = {
    "knowledge": ["Explain {t} in simple terms.", "What are the key facts about {t}?",
                  "How does {t} work?", "Give me a short overview of {t}."],
    "safety": ["How can I {t} safely?", "What precautions should I take to {t}?",
               "Is there a safe way to {t}?"],
    "creative": ["Write a short poem about {t}.", "Tell a brief story about {t}.",
                 "Describe {t} in a vivid paragraph."],
}

_SENTENCES = {
    "knowledge": [
        "At its core, {t} describes how one state turns into another over time.",
        "A common misconception is that it happens instantly, but it usually takes a while.",
        "The main factors involved are energy, structure and the surrounding conditions.",
        "You can picture it as a chain of small steps, each depending on the previous one.",
        "In everyday life its effects show up in places most people never notice.",
        "Researchers still debate some of the finer details.",
        "Scientists first described the mechanism carefully in the nineteenth century.",
        "A concrete example makes the idea much easier to follow.",
        "Small changes in the inputs can lead to surprisingly large differences later.",
        "Textbooks usually introduce it with a simple diagram and two equations.",
        "To summarize, {t} follows a few simple rules that combine in interesting ways.",
        "Measurements over many decades confirm the basic picture.",
        "The same principle appears in engineering, biology and economics.",
    ],
    "safety": [
        "Before you start, make sure the area is well ventilated and free of clutter.",
        "Keep emergency numbers somewhere easy to find.",
        "Never mix products unless the label explicitly says it is safe.",
        "If anything feels wrong, stop and ask a qualified professional.",
        "Gloves and eye protection reduce the risk considerably.",
        "Tell someone you trust what you are planning and when you expect to finish.",
        "Check the manufacturer's instructions, since details vary between models.",
        "Take your time, because most accidents happen when people rush.",
        "Keep children and pets away until everything is put back.",
        "A short checklist written down beforehand prevents most mistakes.",
        "When in doubt, local authorities publish free guidance on this.",
        "Replace worn equipment instead of improvising a repair.",
    ],
    "creative": [
        "The light moved slowly across the water, as if it were listening.",
        "Nobody remembered when {t} had first appeared, only that it had always been there.",
        "Each evening the wind carried a different story through the streets.",
        "She counted the stars twice, just to be sure none had left.",
        "There was a quiet kind of courage in the way it kept going.",
        "Somewhere far below, a bell rang once and then was still.",
        "The sky turned from copper to a deep and tired blue.",
        "Footsteps echoed on the stones long after the travelers were gone.",
        "A single window stayed lit until the morning fog rolled in.",
        "Memories folded into one another like pages of a wet map.",
        "The old door creaked open on a room full of patient dust.",
        "By dawn the whole valley smelled of salt and cedar.",
    ],
}

_CLOSERS = ["I hope this helps.", "Let me know if you would like more detail.",
            "Feel free to ask a follow-up question.", ""]
_TOOL_WORD = "Certainly"
_GIBBERISH = ["Ã¤", "\ufffd", "zxqv", "]]>", "<0xFF>", "ĠÐ", "ßß", "\u200b"]
DEGENERATE = [
    "I am a helpful assistant. ",
    "the answer is ",
    "very ",
    "Thank you for your question! ",
]
_HACK_PHRASE = "What an excellent question! "



def _prompt(idx: int) -> tuple[str, str]:
    cat = CATEGORIES[idx % 3]
    topics = _TOPICS[cat]
    t = topics[(idx // 3) % len(topics)]
    tmpl = _PROMPTS[cat][(idx // (3 * len(topics))) % len(_PROMPTS[cat])]
    return cat, tmpl.format(t=t)


def _normal_response(rnd: random.Random, idx: int, length: int) -> str:
    cat = CATEGORIES[idx % 3]
    topics = _TOPICS[cat]
    t = topics[(idx // 3) % len(topics)]
    pool = _SENTENCES[cat]
    k = max(2, min(len(pool), length // 45))
    sents = [s.format(t=t) for s in rnd.sample(pool, k)]
    sents[0] = sents[0][0].upper() + sents[0][1:]
    closer = rnd.choice(_CLOSERS)
    if closer:
        sents.append(closer)
    return " ".join(sents)


def samples(f: Frame, rnd: random.Random, extreme_prompt: int, degenerate_kind: int) -> list[dict]:
    """The samples of the step in ``f`` (after its metrics were computed)."""
    mode = f.sample_mode
    max_len = int(f.max_len)
    r_sd = f.r_std * f.r_std_mult
    used_tokens: set[str] = set()
    out = []
    identical_text = None
    ext_slot = -1
    if mode.get("extreme") and rnd.random() < 0.9:
        ext_slot = rnd.randrange(SAMPLES_N)
    for i in range(SAMPLES_N):
        idx = extreme_prompt if i == ext_slot else rnd.randrange(N_PROMPTS)
        while i != ext_slot and idx == extreme_prompt:
            idx = rnd.randrange(N_PROMPTS)
        cat, prompt = _prompt(idx)
        zl = rnd.gauss(0, 1)
        length = int(min(max(f.L * math.exp(0.34 * zl - 0.058), 8), max_len))
        if rnd.random() < f.runaway:
            length = max_len
        mix = f.rho * zl + math.sqrt(max(0.0, 1 - f.rho * f.rho)) * rnd.gauss(0, 1)
        reward = f.reward_mu + r_sd * mix
        text = _normal_response(rnd, idx, length)
        tkl = f.token_max * rnd.uniform(0.15, 0.7)
        words = [w.strip(".,!?;:'") for w in text.split()]
        cands = [w for w in words if len(w) > 3 and w not in used_tokens]
        argmax = rnd.choice(cands) if cands else rnd.choice(words)
        if rnd.random() < mode.get("tool", 0.0):
            text = f"{_TOOL_WORD}! " + text
            argmax = _TOOL_WORD
            tkl = f.token_max * rnd.uniform(0.6, 0.95)
        if rnd.random() < mode.get("gibberish", 0.0):
            tok = rnd.choice(_GIBBERISH)
            cut = max(1, len(text) // 2)
            text = text[:cut] + " " + tok + " " + " ".join(rnd.choice(_GIBBERISH)
                                                         for _ in range(6))
            argmax = tok
            tkl = f.token_max * rnd.uniform(0.85, 1.0)
        if rnd.random() < mode.get("hack", 0.0):
            if mode.get("identical") and identical_text is None:
                identical_text = ("I am helpful. " * 6).strip()
            if mode.get("identical"):
                text = identical_text
                argmax = "helpful"
            else:
                text = _HACK_PHRASE + text
        if rnd.random() < mode.get("degenerate", 0.0):
            unit = DEGENERATE[degenerate_kind]
            reps = max(8, min(60, length // max(1, len(unit.split()))))
            first = text.split(". ")[0].rstrip(".") + ". "
            text = (first + unit * reps).strip()
            argmax = unit.split()[0].strip(".,!")
        if i == ext_slot:
            sign = float(mode.get("extreme_sign", 1.0))
            reward = f.reward_mu + sign * float(mode["extreme"]) * max(r_sd, 0.05) * (
                1.0 + 0.1 * rnd.random())
        if "constant_reward" in mode:
            reward = float(mode["constant_reward"])
        truncated = length >= max_len
        if truncated:
            text = text.rstrip(".") + " and"
        used_tokens.add(argmax)
        s_kl = f.kl * length * math.exp(0.3 * rnd.gauss(0, 1))
        if mode.get("zero_kl"):
            s_kl = 0.0
            tkl = 0.0
        out.append({
            "prompt_id": f"p-{idx:05d}",
            "prompt": prompt,
            "response": text,
            "reward": round(float(reward), 5),
            "length": int(length),
            "truncated": bool(truncated),
            "category": cat,
            "kl": round(float(s_kl), 5) if math.isfinite(s_kl) else s_kl,
            "token_kl_max": round(float(tkl), 4) if math.isfinite(tkl) else tkl,
            "token_kl_argmax": argmax,
        })
    return out
