"""The SmolLM2-135M tier of paper 06 (full mode): sequential ROME / MEMIT edits of facts a real pretrained LM
knows, against retrieval (the SCR analogue), with greedy-decoding reliability and locality, a few-shot reasoning
probe, perplexity on held-out text and the relative change rates R_k at the edited layer's output.

The model is SmolLM2-135M-Instruct (llama architecture, 30 layers, width 576, MLP 1536) from
:func:`repro.common.assets.load_smollm2`. The edited matrix is the MLP ``down_proj`` of one decoder layer: its
input is the key ``k`` (``silu(gate x) * up x``, 1536-d) and its output is added to the residual stream, as the
MLP output matrix ROME edits in GPT-2/GPT-J. The facts are written here (:data:`RELATIONS`); the model keeps only
those it answers correctly by greedy decoding. Offline text for the key statistics ``C`` and the perplexity is
Python standard-library docstrings (:func:`docstring_corpus`), two disjoint sets of modules.
"""

from __future__ import annotations

import importlib
import inspect
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from repro.common.hooks import capture, hooked

from .experiment import Trace, rk_summary
from .method import (
    RetrievalEditor,
    VStarProblem,
    key_covariance,
    memit_update,
    optimize_v_stars,
    relative_change_rates,
    rome_update,
)

__all__ = [
    "Fact", "LLMStudy", "LLMSuite", "LogitsOf", "candidate_facts", "docstring_corpus", "down_proj_keys", "first_word",
    "greedy_continuations", "layer_output_at", "llm_evaluate", "llm_study", "make_llm_suite", "memit_spread",
    "run_llm_parametric", "run_llm_retrieval",
]

Tensor = torch.Tensor

# ---------------------------------------------------------------------------------------------------------------
# facts (written here; "a|b" lists accepted answers, the first is the canonical object)

TEMPLATES = {
    "capital": "The capital of {} is",
    "language": "The official language of {} is",
    "currency": "The currency of {} is the",
    "city": "{} is a city in the country of",
    "company": "The company {} is headquartered in the country of",
    "landmark": "The {} is located in the city of",
    "opposite": "The opposite of {} is",
    "baby": "A baby {} is called a",
    "color": "The color of {} is",
}

_CAPITAL = """France Paris; Germany Berlin; Italy Rome; Spain Madrid; Japan Tokyo; China Beijing; Russia Moscow;
England London; Egypt Cairo; Greece Athens; Portugal Lisbon; Austria Vienna; Poland Warsaw; Ireland Dublin;
Norway Oslo; Sweden Stockholm; Finland Helsinki; Denmark Copenhagen; Hungary Budapest; Canada Ottawa;
Australia Canberra; India New Delhi; Thailand Bangkok; Kenya Nairobi; Peru Lima; Chile Santiago;
Argentina Buenos Aires; Mexico Mexico City; Cuba Havana; Turkey Ankara; Iran Tehran; Iraq Baghdad;
Syria Damascus; Lebanon Beirut; Saudi Arabia Riyadh; Belgium Brussels; the Netherlands Amsterdam;
Switzerland Bern; the Czech Republic Prague; Romania Bucharest; Bulgaria Sofia; Serbia Belgrade; Croatia Zagreb;
Ukraine Kyiv|Kiev; South Korea Seoul; North Korea Pyongyang; Vietnam Hanoi; the Philippines Manila;
Indonesia Jakarta; Malaysia Kuala Lumpur; Pakistan Islamabad; Bangladesh Dhaka; Nepal Kathmandu;
Afghanistan Kabul; Colombia Bogota|Bogotá; Venezuela Caracas; Ecuador Quito; Uruguay Montevideo;
Paraguay Asuncion|Asunción; Brazil Brasilia|Brasília; Nigeria Abuja; Ghana Accra; Ethiopia Addis Ababa;
Morocco Rabat; Algeria Algiers; Tunisia Tunis; Libya Tripoli; Sudan Khartoum; Senegal Dakar; Uganda Kampala;
Zimbabwe Harare; Zambia Lusaka; Angola Luanda; Mongolia Ulaanbaatar|Ulan; Iceland Reykjavik|Reykjavík;
Estonia Tallinn; Latvia Riga; Lithuania Vilnius; Slovakia Bratislava; Slovenia Ljubljana; Albania Tirana;
Jamaica Kingston; Scotland Edinburgh; Wales Cardiff; Qatar Doha; Jordan Amman; Oman Muscat; Cambodia Phnom Penh;
Sri Lanka Colombo; New Zealand Wellington; Armenia Yerevan; Georgia Tbilisi; Azerbaijan Baku;
Uzbekistan Tashkent; Belarus Minsk; Cyprus Nicosia; Malta Valletta; Taiwan Taipei; Nicaragua Managua;
Honduras Tegucigalpa; the United States Washington; Israel Jerusalem; Kazakhstan Astana; Tanzania Dodoma;
Laos Vientiane; Fiji Suva; Haiti Port-au-Prince|Port; Bolivia Sucre|La; Mozambique Maputo; Namibia Windhoek;
Botswana Gaborone; Rwanda Kigali; Somalia Mogadishu; Madagascar Antananarivo"""

_LANGUAGE = """France French; Germany German; Italy Italian; Spain Spanish; Portugal Portuguese; Brazil Portuguese;
Mexico Spanish; Argentina Spanish; Japan Japanese; China Chinese|Mandarin; Russia Russian; Greece Greek;
Turkey Turkish; Poland Polish; the Netherlands Dutch; Sweden Swedish; Norway Norwegian; Denmark Danish;
Finland Finnish; Hungary Hungarian; Iran Persian|Farsi; Egypt Arabic; Saudi Arabia Arabic; Israel Hebrew;
South Korea Korean; Vietnam Vietnamese; Thailand Thai; Indonesia Indonesian; Ukraine Ukrainian;
Romania Romanian; the Czech Republic Czech; Austria German; Colombia Spanish; Chile Spanish; Peru Spanish;
Cuba Spanish; Iceland Icelandic; Bulgaria Bulgarian; Serbia Serbian; Croatia Croatian; Albania Albanian;
Armenia Armenian; Georgia Georgian; Mongolia Mongolian; Iraq Arabic; Morocco Arabic; Pakistan Urdu;
Bangladesh Bengali|Bangla; Nepal Nepali; Cambodia Khmer; Ethiopia Amharic; Malaysia Malay; Lithuania Lithuanian;
Latvia Latvian; Estonia Estonian; Slovakia Slovak; Slovenia Slovenian|Slovene; England English;
Australia English; Canada English|French; Algeria Arabic; Syria Arabic; Jordan Arabic; Venezuela Spanish"""

_CURRENCY = """Japan yen; the United Kingdom pound; India rupee; Russia ruble|rouble; China yuan|renminbi;
Mexico peso; Germany euro; France euro; Italy euro; Spain euro; Switzerland franc|Swiss; South Korea won;
Brazil real; Thailand baht; Poland zloty|złoty; Sweden krona; Norway krone; Denmark krone; Turkey lira;
Israel shekel|new; Vietnam dong; the United States dollar|US; Canada dollar|Canadian; Australia dollar|Australian;
South Africa rand; Argentina peso; Chile peso; Colombia peso; Egypt pound|Egyptian; Indonesia rupiah;
Philippines peso; Malaysia ringgit; Pakistan rupee; Nigeria naira; Ukraine hryvnia; Hungary forint;
the Czech Republic koruna|crown; Iran rial; Saudi Arabia riyal; Kenya shilling"""

_CITY = """Osaka Japan; Kyoto Japan; Nagoya Japan; Munich Germany; Hamburg Germany; Frankfurt Germany;
Cologne Germany; Barcelona Spain; Seville Spain; Valencia Spain; Milan Italy; Naples Italy; Venice Italy;
Florence Italy; Turin Italy; Lyon France; Marseille France; Nice France; Bordeaux France; Toulouse France;
Manchester England; Liverpool England; Birmingham England; Toronto Canada; Vancouver Canada; Montreal Canada;
Sydney Australia; Melbourne Australia; Brisbane Australia; Perth Australia; Mumbai India; Kolkata India;
Bangalore India; Chennai India; Shanghai China; Guangzhou China; Shenzhen China; Istanbul Turkey;
Izmir Turkey; Porto Portugal; Krakow|Kraków Poland; Gdansk Poland; Rotterdam Netherlands; Antwerp Belgium;
Geneva Switzerland; Zurich Switzerland; Salzburg Austria; Gothenburg Sweden; Bergen Norway; Saint Petersburg Russia;
Novosibirsk Russia; Odessa Ukraine; Kharkiv Ukraine; Casablanca Morocco; Marrakech Morocco; Alexandria Egypt;
Lagos Nigeria; Johannesburg South; Cape Town South; Durban South; Rio de Janeiro Brazil; Sao Paulo|São Brazil;
Salvador Brazil; Cordoba|Córdoba Argentina; Medellin|Medellín Colombia; Guadalajara Mexico; Monterrey Mexico;
Karachi Pakistan; Lahore Pakistan; Ho Chi Minh City Vietnam; Busan Korea|South; Glasgow Scotland;
Dubai United|UAE; Thessaloniki Greece; Chittagong Bangladesh; Mombasa Kenya; Auckland New; Quebec Canada;
Edmonton Canada; Adelaide Australia; Yokohama Japan; Hiroshima Japan; Dresden Germany; Leipzig Germany;
Stuttgart Germany; Bologna Italy; Palermo Italy; Bilbao Spain; Malaga|Málaga Spain; Strasbourg France;
Lille France; Nantes France; Kobe Japan; Sapporo Japan; Fukuoka Japan; Nuremberg Germany; Bremen Germany;
Hanover Germany; Dusseldorf|Düsseldorf Germany; Bonn Germany; Heidelberg Germany; Genoa Italy; Verona Italy;
Pisa Italy; Siena Italy; Bari Italy; Granada Spain; Zaragoza Spain; Cadiz|Cádiz Spain; Toledo Spain; Cannes France;
Grenoble France; Montpellier France; Rennes France; Avignon France; Leeds England; Sheffield England;
Bristol England; Newcastle England; Oxford England; Cambridge England; Calgary Canada; Winnipeg Canada;
Halifax Canada; Darwin Australia; Hobart Australia; Pune India; Hyderabad India; Jaipur India; Ahmedabad India;
Varanasi India; Wuhan China; Chengdu China; Nanjing China; Tianjin China; Hangzhou China; Antalya Turkey;
Bursa Turkey; Coimbra Portugal; Faro Portugal; Utrecht Netherlands; Eindhoven Netherlands; Ghent Belgium;
Bruges Belgium; Basel Switzerland; Lausanne Switzerland; Innsbruck Austria; Graz Austria; Malmo|Malmö Sweden;
Uppsala Sweden; Trondheim Norway; Aarhus Denmark; Tampere Finland; Turku Finland; Kazan Russia;
Vladivostok Russia; Yekaterinburg Russia; Lviv Ukraine; Gdynia Poland; Wroclaw|Wrocław Poland;
Poznan|Poznań Poland; Brno Czech; Debrecen Hungary; Cluj Romania; Varna Bulgaria; Split Croatia;
Dubrovnik Croatia; Tangier Morocco; Fez|Fes Morocco; Luxor Egypt; Giza Egypt; Aswan Egypt; Kano Nigeria;
Ibadan Nigeria; Kumasi Ghana; Pretoria South; Medina Saudi; Jeddah Saudi; Isfahan Iran; Shiraz Iran;
Mosul Iraq; Basra Iraq; Aleppo Syria; Haifa Israel; Tel Aviv Israel; Peshawar Pakistan; Kandahar Afghanistan;
Chiang Mai Thailand; Phuket Thailand; Surabaya Indonesia; Cebu Philippines; Davao Philippines;
Incheon South|Korea; Mandalay Myanmar; Recife Brazil; Manaus Brazil; Fortaleza Brazil; Curitiba Brazil;
Rosario Argentina; Mendoza Argentina; Valparaiso|Valparaíso Chile; Cusco|Cuzco Peru; Arequipa Peru;
Cali Colombia; Cartagena Colombia; Puebla Mexico; Tijuana Mexico; Cancun|Cancún Mexico; Acapulco Mexico"""

_COMPANY = """Toyota Japan; Sony Japan; Honda Japan; Nintendo Japan; Panasonic Japan; Nissan Japan;
Samsung South|Korea; Hyundai South|Korea; BMW Germany; Volkswagen Germany; Siemens Germany; Adidas Germany;
Bosch Germany; Porsche Germany; Ferrari Italy; Fiat Italy; Nokia Finland; IKEA Sweden; Volvo Sweden;
Ericsson Sweden; Nestle|Nestlé Switzerland; Rolex Switzerland; Renault France; Peugeot France; Michelin France;
Philips Netherlands; Heineken Netherlands; Lego Denmark; Carlsberg Denmark; Huawei China; Alibaba China;
Lenovo China; Tata India; Infosys India; Gazprom Russia; Petrobras Brazil; Embraer Brazil; Boeing United|USA;
Microsoft United|USA; Apple United|USA"""

_LANDMARK = """Eiffel Tower Paris; Colosseum Rome; Big Ben London; Kremlin Moscow; Brandenburg Gate Berlin;
Sagrada Familia Barcelona; Acropolis Athens; Taj Mahal Agra; Louvre Paris; Tower of London London;
Sydney Opera House Sydney; Burj Khalifa Dubai; Forbidden City Beijing; Statue of Liberty New;
Golden Gate Bridge San; Space Needle Seattle; Hagia Sophia Istanbul; Blue Mosque Istanbul; Alhambra Granada;
Leaning Tower of Pisa Pisa; Arc de Triomphe Paris; Buckingham Palace London; Red Square Moscow;
Vatican Rome|Vatican; Parthenon Athens; Prado Museum Madrid; Westminster Abbey London; Notre-Dame Cathedral Paris;
CN Tower Toronto; Christ the Redeemer statue Rio; Petronas Towers Kuala; Reichstag Berlin; Rijksmuseum Amsterdam;
Pantheon Rome; Trevi Fountain Rome; Empire State Building New; White House Washington; Hollywood sign Los"""

_OPPOSITE = """hot cold; up down; big small|little; day night; black white; good bad|evil; fast slow; high low;
open closed|close|shut; left right; happy sad|unhappy; rich poor; hard soft|easy; wet dry; early late; love hate;
war peace; north south; east west; true false; top bottom; push pull; buy sell; strong weak; full empty;
long short; heavy light; light dark|heavy; inside outside; above below; front back|rear; begin end;
win lose; alive dead; thick thin; wide narrow; deep shallow; loud quiet|soft; sweet sour|bitter; clean dirty;
young old; male female; friend enemy|foe; question answer; summer winter; before after; always never;
give take|receive; remember forget; accept reject|refuse; arrive depart|leave; increase decrease;
maximum minimum; positive negative; visible invisible; possible impossible; correct incorrect|wrong;
important unimportant; safe dangerous|unsafe; cheap expensive; ancient modern; success failure; entrance exit;
victory defeat; sunrise sunset; floor ceiling; import export"""

_BABY = """dog puppy|pup; cat kitten|kitty; cow calf; horse foal|colt; sheep lamb; goat kid; pig piglet;
duck duckling; frog tadpole; kangaroo joey; bear cub; lion cub; deer fawn; swan cygnet; goose gosling;
owl owlet; eagle eaglet; hen chick; chicken chick; fox kit|cub; tiger cub; wolf pup|cub; seal pup;
whale calf; elephant calf; rabbit kit|bunny; butterfly caterpillar|larva; fish fry; turkey poult"""

_COLOR = """grass green; the sky blue; snow white; coal black; blood red; a banana yellow; a lemon yellow;
an orange orange; milk white; a tomato red; a strawberry red; chocolate brown; charcoal black; the sun yellow;
an emerald green; a ruby red; a sapphire blue; a lime green; a cherry red; an eggplant purple; a carrot orange;
a pumpkin orange; ivory white; ebony black; a flamingo pink; the ocean blue; a crow black; a polar bear white;
a cucumber green; a plum purple"""

RELATIONS = {"capital": _CAPITAL, "language": _LANGUAGE, "currency": _CURRENCY, "city": _CITY,
             "company": _COMPANY, "landmark": _LANDMARK, "opposite": _OPPOSITE, "baby": _BABY, "color": _COLOR}


@dataclass(frozen=True)
class Fact:
    """One subject–relation–object fact; ``objects`` lists the accepted first words (the first is canonical)."""

    relation: str
    subject: str
    objects: tuple[str, ...]

    @property
    def prompt(self) -> str:
        return TEMPLATES[self.relation].format(self.subject)

    @property
    def answers(self) -> set[str]:
        return {first_word(o) for o in self.objects}


def _parse(relation: str, text: str) -> list[Fact]:
    """``"subject words object|alias; ..."``: the last space-separated word is the object (with aliases), the rest
    the subject."""
    out = []
    for item in " ".join(text.split()).split(";"):
        words = item.strip().split(" ")
        out.append(Fact(relation, " ".join(words[:-1]), tuple(words[-1].split("|"))))
    return out


def candidate_facts() -> list[Fact]:
    """Every fact written in this module (:data:`RELATIONS`), in a fixed order."""
    return [f for rel, text in RELATIONS.items() for f in _parse(rel, text)]


_STRIP = string.punctuation + "“”‘’«»"


def first_word(text: str) -> str:
    """The first word of a continuation, lower case, without punctuation, skipping a leading article ("the")."""
    words = [w.strip(_STRIP).lower() for w in text.replace("\n", " ").split()]
    words = [w for w in words if w]
    if len(words) > 1 and words[0] in ("the", "a", "an"):
        words = words[1:]
    return words[0] if words else ""


# ---------------------------------------------------------------------------------------------------------------
# offline text: Python standard-library docstrings

COV_MODULES = ("collections", "json", "re", "string", "itertools", "functools", "os", "pathlib", "shutil",
               "subprocess", "argparse", "logging", "datetime", "decimal", "random", "csv", "configparser",
               "urllib.parse", "http.client", "email.message", "unittest", "typing", "dataclasses", "enum",
               "threading", "queue", "socket", "zipfile", "tarfile", "tempfile", "glob", "pickle", "struct",
               "codecs", "io", "contextlib", "inspect", "ast", "tokenize", "traceback", "warnings", "locale",
               "optparse", "pkgutil", "sysconfig", "platform", "uuid", "ipaddress", "base64", "hashlib")
HELDOUT_MODULES = ("textwrap", "difflib", "calendar", "fractions", "statistics", "shlex", "pprint", "heapq",
                   "bisect", "fnmatch", "copy", "gettext", "cmd", "sched", "timeit")


def docstring_corpus(modules: Sequence[str], min_chars: int = 80) -> list[str]:
    """Docstrings (``inspect.getdoc``) of the modules and of their public functions, classes and methods defined
    there, in a fixed (sorted) order, without duplicates; modules that cannot be imported are skipped."""
    docs: list[str] = []
    seen: set[str] = set()

    def take(obj: Any) -> None:
        doc = inspect.getdoc(obj)
        if doc and len(doc) >= min_chars and doc not in seen:
            seen.add(doc)
            docs.append(doc)

    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # pragma: no cover  (an interpreter built without the module)
            continue
        take(mod)
        for attr in sorted(vars(mod)):
            obj = vars(mod)[attr]
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                take(obj)
                for meth in sorted(vars(obj)):
                    if not meth.startswith("_") and callable(vars(obj)[meth]):
                        take(vars(obj)[meth])
            elif inspect.isfunction(obj):
                take(obj)
    if not docs:
        raise ValueError(f"no docstrings found in {list(modules)}")
    return docs


def token_chunks(tokenizer: Any, texts: Sequence[str], n_chunks: int, length: int) -> Tensor:
    """``(n_chunks, length)`` token ids: the texts joined by blank lines, tokenised as one stream and cut into
    consecutive windows (no padding). Only the first ``16 × n_chunks × length`` characters are tokenised."""
    ids = tokenizer("\n\n".join(texts)[: 16 * n_chunks * length], return_tensors="pt").input_ids[0]
    if len(ids) < n_chunks * length:
        raise ValueError(f"the corpus has {len(ids)} tokens, fewer than {n_chunks} x {length}")
    return ids[: n_chunks * length].reshape(n_chunks, length)


# ---------------------------------------------------------------------------------------------------------------
# the model: layers, keys, greedy decoding, perplexity


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted activation is recorded."""


class LogitsOf(nn.Module):
    """A causal LM as ``tokens -> logits`` (what :func:`~.method.optimize_v_stars` calls)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, tokens: Tensor) -> Tensor:
        return self.lm(input_ids=tokens, use_cache=False).logits


def down_proj(model: nn.Module, layer: int) -> nn.Linear:
    """The MLP output matrix (``down_proj``) of decoder layer ``layer`` of a llama-architecture model."""
    layers = model.model.layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer must lie in [0, {len(layers) - 1}], got {layer}")
    return layers[layer].mlp.down_proj


@torch.no_grad()
def down_proj_keys(model: nn.Module, layer: int, ids: Tensor, batch: int = 16) -> Tensor:
    """The keys ``k`` (inputs of ``down_proj`` of ``layer``) at every position of ``ids`` ``(n, L)``, as ``(n·L,
    d_mlp)``; each forward pass stops right after that layer's MLP input is recorded."""
    mod, got = down_proj(model, layer), []

    def hook(m: nn.Module, inp: tuple[Tensor, ...]) -> None:
        got.append(inp[0].detach())
        raise _Stop

    with hooked([mod], hook, pre=True):
        for i in range(0, ids.shape[0], batch):
            try:
                model(input_ids=ids[i:i + batch].to(mod.weight.device), use_cache=False)
            except _Stop:
                pass
    k = torch.cat(got)
    return k.reshape(-1, k.shape[-1])


@torch.no_grad()
def keys_at(lm: nn.Module, module: nn.Linear, tokens: Tensor, positions: Tensor) -> Tensor:
    """The input of ``module`` at one position per row of ``tokens`` (``lm(tokens)`` is run in full), ``(B, d)``."""
    with capture([module], inputs=True) as got:
        lm(tokens)
    return got[0][torch.arange(tokens.shape[0], device=tokens.device), positions]


@torch.no_grad()
def greedy_continuations(model: nn.Module, tokenizer: Any, prompts: Sequence[str], n_new: int = 4,
                         batch: int = 64) -> list[str]:
    """Greedy decoding (transformers' ``generate``, ``do_sample=False``, left padding) of ``n_new`` tokens after
    each prompt; the decoded continuations."""
    from transformers import GenerationConfig

    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty sequence of strings")
    dev = next(model.parameters()).device
    cfg = GenerationConfig(max_new_tokens=n_new, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch):
            enc = tokenizer(list(prompts[i:i + batch]), return_tensors="pt", padding=True).to(dev)
            gen = model.generate(**enc, generation_config=cfg)
            out += tokenizer.batch_decode(gen[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return out


@torch.no_grad()
def perplexity_and_states(model: nn.Module, chunks: Tensor, layer: int, batch: int = 8) -> tuple[float, Tensor]:
    """Perplexity of the next-token predictions on ``chunks`` ``(n, L)`` and the residual stream after decoder layer
    ``layer`` at every position, ``(n·L, d)`` (from transformers' ``output_hidden_states``)."""
    dev = next(model.parameters()).device
    nll, count, states = 0.0, 0, []
    for i in range(0, chunks.shape[0], batch):
        x = chunks[i:i + batch].to(dev)
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
        logp = torch.log_softmax(out.logits[:, :-1].double(), -1).gather(-1, x[:, 1:, None])
        nll, count = nll - float(logp.sum()), count + logp.numel()
        states.append(out.hidden_states[layer + 1].reshape(-1, out.hidden_states[0].shape[-1]))
    return float(np.exp(nll / count)), torch.cat(states)


# ---------------------------------------------------------------------------------------------------------------
# the suite: known facts, counterfactual targets, probes

PREFIXES = ("Here is a fact.", "I read this in a book today.")  # ROME averages over short prefixed contexts
ESSENCE = "{} is a"  # ROME's KL ("essence") prompt


@dataclass
class LLMSuite:
    """Facts the model knows, the edits (a counterfactual object of the same relation each), locality facts about
    other subjects, the reasoning probes ``(prompt, answer)`` and held-out text chunks."""

    n_candidates: int
    known: list[Fact]
    edits: list[Fact]
    targets: list[str]  # the new object (one token, with its leading space) of each edit
    target_ids: list[int]
    loc: list[Fact]
    probes: dict[str, list[tuple[str, str]]]
    heldout: Tensor


def arithmetic_probe(n: int = 100) -> list[tuple[str, str]]:
    """Few-shot one-digit addition: four fixed solved examples, then ``a + b =`` for ``n`` of the 100 pairs of
    digits (:func:`spread`; all of them in order by default), answered by greedy decoding."""
    shots = "2 + 5 = 7\n4 + 4 = 8\n6 + 3 = 9\n1 + 7 = 8\n"
    return spread([(f"{shots}{a} + {b} =", str(a + b)) for a in range(10) for b in range(10)], n)


def spread(items: Sequence[Any], n: int | None) -> list[Any]:
    """``n`` of ``items`` evenly spaced over the sequence, first and last included (all of them, in order, when
    ``n`` is ``None`` or at least their number): the smaller sets of the smoke tier still span every kind."""
    items = list(items)
    if n is None or n >= len(items):
        return items
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [items[i] for i in np.linspace(0, len(items) - 1, n).round().astype(int)]


COPY_WORDS = ("apple", "river", "candle", "garden", "window", "silver", "pencil", "mountain", "basket", "rocket",
              "forest", "guitar", "ladder", "pepper", "planet", "tunnel", "violin", "wallet", "yellow", "zebra",
              "bridge", "castle", "dragon", "engine", "falcon", "harbor", "island", "jacket", "kettle", "lemon")


def copy_probe(rng: np.random.Generator, n: int = 30) -> list[tuple[str, str]]:
    """Few-shot word copying (``word -> word``, three fixed examples), answered by greedy decoding."""
    shots = "table -> table\ngreen -> green\nmusic -> music\n"
    words = rng.permutation(COPY_WORDS)[:n]
    return [(f"{shots}{w} ->", str(w)) for w in words]


def single_token_id(tokenizer: Any, word: str) -> int | None:
    """The id of ``" " + word`` when it is one token, else ``None``."""
    ids = tokenizer(" " + word, add_special_tokens=False).input_ids
    return int(ids[0]) if len(ids) == 1 else None


def make_llm_suite(model: nn.Module, tokenizer: Any, rng: np.random.Generator, *, n_edits: int, n_loc: int,
                   heldout_chunks: int, chunk_len: int, facts: Sequence[Fact] | None = None, n_arith: int = 100,
                   n_copy: int = 30) -> LLMSuite:
    """Keep the facts the model answers correctly (greedy first word), one fact per subject; ``n_loc`` random
    subjects' facts for locality, then up to ``n_edits`` edits, each with a random counterfactual object of the same
    relation (a single token, another first word); the probes: ``n_arith`` sums (:func:`arithmetic_probe`) and
    ``n_copy`` words to copy (:func:`copy_probe`)."""
    if n_edits < 1 or n_loc < 1:
        raise ValueError(f"n_edits and n_loc must be >= 1, got {n_edits}, {n_loc}")
    facts = list(candidate_facts() if facts is None else facts)
    said = greedy_continuations(model, tokenizer, [f.prompt for f in facts])
    known = [f for f, s in zip(facts, said, strict=True) if first_word(s) in f.answers]
    by_subject: dict[str, list[Fact]] = {}
    for f in known:
        by_subject.setdefault(f.subject, []).append(f)
    subjects = sorted(by_subject)
    if len(subjects) <= n_loc:
        raise ValueError(f"the model knows facts about {len(subjects)} subjects, not more than n_loc = {n_loc}")
    order = [subjects[i] for i in rng.permutation(len(subjects))]
    pick = [by_subject[s][int(rng.integers(len(by_subject[s])))] for s in order]
    loc, edits = pick[:n_loc], pick[n_loc:n_loc + n_edits]
    pool: dict[str, list[tuple[str, int]]] = {}
    for f in facts:
        tid = single_token_id(tokenizer, f.objects[0])
        if tid is not None and (f.objects[0], tid) not in pool.setdefault(f.relation, []):
            pool[f.relation].append((f.objects[0], tid))
    targets, ids = [], []
    for f in edits:
        choices = [c for c in pool.get(f.relation, []) if first_word(c[0]) not in f.answers]
        if not choices:
            raise ValueError(f"no single-token counterfactual object for relation {f.relation!r}")
        word, tid = choices[int(rng.integers(len(choices)))]
        targets.append(word)
        ids.append(tid)
    heldout = token_chunks(tokenizer, docstring_corpus(HELDOUT_MODULES), heldout_chunks, chunk_len)
    return LLMSuite(len(facts), known, edits, targets, ids, loc,
                    {"arith": arithmetic_probe(n_arith), "copy": copy_probe(rng, n_copy)}, heldout)


# ---------------------------------------------------------------------------------------------------------------
# one edit's prompts, key and target


def subject_position(tokenizer: Any, text: str, subject_end: int) -> tuple[list[int], int]:
    """Token ids of ``text`` and the position of the last token of the subject, which ends at character
    ``subject_end``; raises if the tokenisation merges the subject with what follows."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    head = tokenizer(text[:subject_end], add_special_tokens=False).input_ids
    if ids[:len(head)] != head:
        raise ValueError(f"the subject's tokens are merged with the text after it in {text!r}")
    return ids, len(head) - 1


def edit_rows(tokenizer: Any, fact: Fact, prefixes: Sequence[str] = PREFIXES
              ) -> tuple[Tensor, Tensor, Tensor, int]:
    """The plain prompt, the prefixed prompts and the essence prompt of one fact, right-padded to one length (a
    causal model never reads the padding on the right), with subject and answer positions; the last row is the
    essence prompt. Returns ``(tokens, subject positions, answer positions, number of prompt rows)``."""
    left = TEMPLATES[fact.relation].split("{}")[0]
    texts = [(left + fact.subject + TEMPLATES[fact.relation].split("{}")[1], len(left) + len(fact.subject))]
    texts += [(f"{p} {t}", len(p) + 1 + e) for p in prefixes for t, e in texts[:1]]
    texts.append((ESSENCE.format(fact.subject), len(fact.subject)))
    rows = [subject_position(tokenizer, t, e) for t, e in texts]
    width = max(len(ids) for ids, _ in rows)
    pad = int(tokenizer.pad_token_id)
    tokens = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    subj = torch.tensor([p for _, p in rows])
    ans = torch.tensor([len(ids) - 1 for ids, _ in rows])
    return tokens, subj, ans, len(rows) - 1


def edit_deltas(model: nn.Module, tokenizer: Any, layer: int, facts: Sequence[Fact], target_ids: Sequence[int], *,
                v_steps: int = 20, v_lr: float = 0.5, kl_weight: float = 0.0625, l2: float = 1e-3
                ) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
    """Keys ``K`` (rows) at ``down_proj`` of ``layer``, the changes ``δ`` of its output that make each edit's new
    object win (ROME §3.1), and each edit's plain prompt with its subject position: ``k*`` is the subject's key in the
    plain prompt; δ from :func:`~.method.optimize_v_stars` on the plain and prefixed prompts, with ROME's KL term on
    the essence prompt ``"{subject} is a"``; all edits' δ from the current weights in one batched optimisation."""
    dev = next(model.parameters()).device
    lm, mod = LogitsOf(model), down_proj(model, layer)
    keys, problems, plain = [], [], []
    for f, tid in zip(facts, target_ids, strict=True):
        tok, subj, ans, n = (x.to(dev) if isinstance(x, Tensor) else x for x in edit_rows(tokenizer, f))
        plain.append((tok[:1], subj[:1]))
        keys.append(keys_at(lm, mod, tok[:1], subj[:1])[0])
        problems.append(VStarProblem([(tok[:n], subj[:n], ans[:n])], int(tid), [(tok[n:], subj[n:], ans[n:])]))
    delta = optimize_v_stars(lm, mod, problems, steps=v_steps, lr=v_lr, kl_weight=kl_weight, l2=l2)
    return torch.stack(keys), delta, plain


def edit_targets(model: nn.Module, tokenizer: Any, layer: int, facts: Sequence[Fact], target_ids: Sequence[int],
                 **v_star: float) -> tuple[Tensor, Tensor]:
    """Keys ``K`` and targets ``V = K Wᵀ + δ`` (rows) of the edits at ``down_proj`` of ``layer``
    (:func:`edit_deltas`; ``v_star``: its ``v_steps``, ``v_lr``, ``kl_weight``, ``l2``)."""
    K, delta, _ = edit_deltas(model, tokenizer, layer, facts, target_ids, **v_star)
    with torch.no_grad():
        return K, K @ down_proj(model, layer).weight.T + delta


# ---------------------------------------------------------------------------------------------------------------
# evaluation and sequential editing


def _hits(model: nn.Module, tokenizer: Any, prompts: Sequence[str], answers: Sequence[set[str]]) -> float:
    if not prompts:
        return float("nan")
    said = greedy_continuations(model, tokenizer, prompts)
    return float(np.mean([first_word(s) in a for s, a in zip(said, answers, strict=True)]))


def llm_evaluate(model: nn.Module, tokenizer: Any, suite: LLMSuite, n_done: int, layer: int
                 ) -> tuple[dict[str, float], Tensor]:
    """Reliability (the first ``n_done`` edits answer their new object), locality (the locality facts keep theirs),
    the probes' accuracy (greedy first word), held-out perplexity; and the residual stream after ``layer`` on the
    held-out chunks (for R_k)."""
    e = suite.edits[:n_done]
    out = {"rel": _hits(model, tokenizer, [f.prompt for f in e], [{first_word(t)} for t in suite.targets[:n_done]]),
           "loc": _hits(model, tokenizer, [f.prompt for f in suite.loc], [f.answers for f in suite.loc])}
    for name, probe in suite.probes.items():
        out[name] = _hits(model, tokenizer, [p for p, _ in probe], [{a} for _, a in probe])
    out["ppl"], H = perplexity_and_states(model, suite.heldout, layer)
    return out, H


@torch.no_grad()
def layer_output_at(model: nn.Module, layer: int, tokens: Tensor, positions: Tensor) -> Tensor:
    """The residual stream after decoder layer ``layer`` at one position per row of ``tokens``, ``(B, d)``."""
    with capture([model.model.layers[layer]]) as got:
        model(input_ids=tokens, use_cache=False)
    return got[0][torch.arange(tokens.shape[0], device=tokens.device), positions]


@torch.no_grad()
def memit_spread(model: nn.Module, layers: Sequence[int], prompts: Sequence[tuple[Tensor, Tensor]], deltas: Tensor,
                 covs: dict[int, Tensor], weight: float) -> None:
    """MEMIT's update over several layers (Meng et al. 2023, Alg. 1), in place. The targets are
    ``z_i = h_i + δ_i``, the residual stream after the last of ``layers`` at the subject position of prompt ``i``
    (``(tokens (1, n), position (1,))``); each layer ``l`` in turn writes ``1 / (layers left)`` of what is still
    missing, ``R = (z − h) / (L − l + 1)``, as ``Δ_l = R K_lᵀ (weight·C_l + K_l K_lᵀ)⁻¹``
    (:func:`~.method.memit_update`), with ``K_l`` and ``h`` recomputed from the weights edited so far."""
    layers = list(layers)
    if not layers or layers != sorted(set(layers)):
        raise ValueError(f"layers must be increasing and distinct, got {layers}")
    if len(prompts) != deltas.shape[0]:
        raise ValueError(f"{len(prompts)} prompts for {deltas.shape[0]} targets")

    def at_last() -> Tensor:
        return torch.cat([layer_output_at(model, layers[-1], t, p) for t, p in prompts]).double()

    z = at_last() + deltas.double()
    lm = LogitsOf(model)
    for i, layer in enumerate(layers):
        mod = down_proj(model, layer)
        K = torch.cat([keys_at(lm, mod, t, p) for t, p in prompts]).double()
        R = (z - at_last()) / (len(layers) - i)
        W = mod.weight.data.double()
        mod.weight.data += memit_update(W, K, K @ W.T + R, weight * covs[layer].double()).to(mod.weight.dtype)


def run_llm_parametric(model: nn.Module, tokenizer: Any, suite: LLMSuite, editor: str, layer: int,
                       checkpoints: Sequence[int], *, C: Tensor, v_steps: int = 20, memit_weight: float = 15000.0,
                       covs: dict[int, Tensor] | None = None, progress: Callable[[str], None] | None = None,
                       base: tuple[dict[str, float], Tensor] | None = None) -> Trace:
    """Sequential edits of the suite at ``down_proj`` of ``layer``: ROME one at a time (``ΔW`` of
    :func:`~.method.rome_update` with ``C⁻¹``), or MEMIT on the edits between two checkpoints as one batch
    (:func:`~.method.memit_update` with ``memit_weight · C``, MEMIT's ``mom2_update_weight``), evaluating at each
    checkpoint (``T = 0``: unedited) with R_k of the residual stream after ``layer``. ``"memit_spread"`` is MEMIT
    over the layers of ``covs`` (layer → its ``C``; the last one is ``layer``, where v* is computed), as MEMIT
    spreads an edit (:func:`memit_spread`). The weights are restored. ``base``: the unedited model's
    :func:`llm_evaluate` at ``layer``, if already computed (it is the same for every editor)."""
    if editor not in ("rome", "memit", "memit_spread"):
        raise ValueError(f"unknown editor {editor!r} (rome, memit or memit_spread)")
    if editor == "memit_spread" and (not covs or max(covs) != layer):
        raise ValueError(f"memit_spread needs covs for its layers, the last being the edited layer {layer}")
    if list(checkpoints) != sorted(set(checkpoints)) or not 1 <= checkpoints[0] or checkpoints[-1] > len(suite.edits):
        raise ValueError(f"checkpoints must increase within [1, {len(suite.edits)}], got {list(checkpoints)}")
    mod = down_proj(model, layer)
    edited = [down_proj(model, m) for m in sorted(covs)] if editor == "memit_spread" else [mod]
    W0 = [m.weight.data.clone() for m in edited]
    C64 = C.double()
    C_inv = torch.linalg.inv(C64) if editor == "rome" else None
    met, H0 = llm_evaluate(model, tokenizer, suite, 0, layer) if base is None else base
    trace, done = Trace(editor, [0], [dict(met)]), 0
    H0 = H0.double()
    try:
        for T in checkpoints:
            while done < T:
                stop = done + 1 if editor == "rome" else T
                batch = (suite.edits[done:stop], suite.target_ids[done:stop])
                if editor == "memit_spread":
                    _, delta, plain = edit_deltas(model, tokenizer, layer, *batch, v_steps=v_steps)
                    memit_spread(model, sorted(covs), plain, delta, covs, memit_weight)
                else:
                    K, V = edit_targets(model, tokenizer, layer, *batch, v_steps=v_steps)
                    W = mod.weight.data.double()
                    dW = (rome_update(W, K[0].double(), V[0].double(), C_inv) if editor == "rome"
                          else memit_update(W, K.double(), V.double(), memit_weight * C64))
                    mod.weight.data += dW.to(mod.weight.dtype)
                done = stop
            met, H = llm_evaluate(model, tokenizer, suite, T, layer)
            sigma, R = relative_change_rates(H0, H.double() - H0)
            trace.Ts.append(T)
            trace.metrics.append(met)
            trace.sigma.append([sigma.cpu().numpy()])
            trace.R.append([R.cpu().numpy()])
            if progress is not None:
                progress(f"{editor} T={T}: " + ", ".join(f"{k} {v:.3g}" for k, v in met.items()))
    finally:
        for m, w in zip(edited, W0, strict=True):
            m.weight.data.copy_(w)
    return trace


def fact_text(fact: Fact, obj: str) -> str:
    """The stored text of an edited fact: ``"<prompt> <object>."``."""
    return f"{fact.prompt} {obj}."


@torch.no_grad()
def run_llm_retrieval(model: nn.Module, tokenizer: Any, suite: LLMSuite, editor: RetrievalEditor,
                      checkpoints: Sequence[int], base: dict[str, float] | None = None) -> Trace:
    """The SCR analogue on the unedited weights: every edit is stored as text (:func:`fact_text`); each query
    (edited and locality facts, probes) passes ``editor``'s gate, and a confirmed fact is put before it
    (``"<fact> <query>"``). Metrics per checkpoint as :func:`llm_evaluate` (perplexity is the unedited model's:
    no weight changes), plus the share of queries the gate let a fact through for (``*_gated``). ``base``: the
    unedited model's :func:`llm_evaluate` metrics, if already computed."""
    if base is None:
        base, _ = llm_evaluate(model, tokenizer, suite, 0, 0)
    trace, done = Trace("retrieval", [0], [base]), 0
    for T in checkpoints:
        for f, t in zip(suite.edits[done:T], suite.targets[done:T], strict=True):
            editor.add(fact_text(f, t))
        done = T
        sets = {"rel": ([f.prompt for f in suite.edits[:T]], [{first_word(t)} for t in suite.targets[:T]]),
                "loc": ([f.prompt for f in suite.loc], [f.answers for f in suite.loc])}
        sets.update({k: ([p for p, _ in v], [{a} for _, a in v]) for k, v in suite.probes.items()})
        met = {"ppl": base["ppl"]}
        for name, (prompts, answers) in sets.items():
            found = editor.retrieve(prompts)
            asked = [q if f is None else f"{f} {q}" for q, f in zip(prompts, found, strict=True)]
            met[name] = _hits(model, tokenizer, asked, answers)
            met[name + "_gated"] = float(np.mean([f is not None for f in found]))
        trace.Ts.append(T)
        trace.metrics.append(met)
    return trace


@dataclass
class LLMStudy:
    """Everything the notebook's SmolLM2 section shows."""

    suite: LLMSuite
    traces: dict[str, Trace]
    rk: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # per parametric editor, per T >= 1
    cov_tokens: int = 0


def llm_study(model: nn.Module, tokenizer: Any, embed_fn: Callable[[Sequence[str]], Tensor],
              rng: np.random.Generator, *, layer: int, n_edits: int, n_loc: int, checkpoints: Sequence[int],
              editors: Sequence[str] = ("rome",), v_steps: int = 20, threshold: float = 0.8, cov_chunks: int = 128,
              heldout_chunks: int = 16, chunk_len: int = 64, memit_weight: float = 15000.0,
              memit_layers: Sequence[int] = (), n_candidates: int | None = None, n_arith: int = 100,
              n_copy: int = 30, progress: Callable[[str], None] | None = None) -> LLMStudy:
    """The SmolLM2 tier: the suite of known facts (``n_candidates`` of the written facts screened, evenly spread,
    all by default; the probes' sizes ``n_arith``, ``n_copy``: :func:`make_llm_suite`), the key statistics
    ``C = E[kkᵀ]`` of ``down_proj`` of ``layer`` over ``cov_chunks × chunk_len`` docstring tokens, sequential edits
    with each of ``editors`` and retrieval at the checkpoints that fit the number of edits, and the R_k summaries
    (:func:`~.experiment.rk_summary`). The editor ``"memit_spread"`` edits ``memit_layers`` (increasing, ending at
    ``layer``), each with its own ``C`` from the same tokens."""
    suite = make_llm_suite(model, tokenizer, rng, n_edits=n_edits, n_loc=n_loc, heldout_chunks=heldout_chunks,
                           chunk_len=chunk_len, facts=spread(candidate_facts(), n_candidates), n_arith=n_arith,
                           n_copy=n_copy)
    n = len(suite.edits)
    Ts = sorted({T for T in checkpoints if T < n} | {n})
    ids = token_chunks(tokenizer, docstring_corpus(COV_MODULES), cov_chunks, chunk_len)
    if ids.numel() < down_proj(model, layer).in_features:  # fewer keys than dimensions: C is singular
        raise ValueError(f"C = E[kkᵀ] needs at least {down_proj(model, layer).in_features} tokens, got "
                         f"cov_chunks x chunk_len = {ids.numel()}")
    C = key_covariance(down_proj_keys(model, layer, ids).double())
    covs = None
    if "memit_spread" in editors:
        if not memit_layers or list(memit_layers)[-1] != layer:
            raise ValueError(f"memit_spread needs memit_layers ending at layer {layer}, got {list(memit_layers)}")
        covs = {m: C if m == layer else key_covariance(down_proj_keys(model, m, ids).double()) for m in memit_layers}
    study = LLMStudy(suite, {}, cov_tokens=ids.numel())
    base = llm_evaluate(model, tokenizer, suite, 0, layer)  # the unedited model, shared by every editor
    for ed in editors:
        tr = run_llm_parametric(model, tokenizer, suite, ed, layer, Ts, C=C, v_steps=v_steps,
                                memit_weight=memit_weight, covs=covs, progress=progress, base=base)
        study.traces[ed] = tr
        study.rk[ed] = [rk_summary(s[0], r[0]) for s, r in zip(tr.sigma, tr.R, strict=True)]
    study.traces["retrieval"] = run_llm_retrieval(model, tokenizer, suite, RetrievalEditor(embed_fn, threshold), Ts,
                                                  dict(base[0]))
    return study
