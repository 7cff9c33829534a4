#!/usr/bin/env python3
"""Write the workbench's example data: a tiny Kimi-like tokenizer and four prompt files.

    python scripts/make_examples.py [--out examples]

Input: `examples/text/alice_chapter_1.txt`, the opening of chapter I of Lewis Carroll's
"Alice's Adventures in Wonderland" (1865, public domain). Output (deterministic: a fixed seed,
no download; a rerun writes the same bytes):

    tokenizer/tokenizer.json         WordLevel model, lowercase normaliser, whitespace split
    tokenizer/tokenizer_config.json  special tokens, Kimi-K2.5-like chat template (`thinking`)
    data/glaive_fc.jsonl             function calling: system prompt with JSON tool schemas
    data/code_instruct.jsonl         code instructions, a few with long code listings
    data/pretokenized.jsonl          {sample_id, input_ids} rendered with the chat template
    data/texts.jsonl                 {sample_id, text} for the `text` input mode
    data/tool_turns.jsonl            function-calling conversations (OpenAI layout: tools,
                                     messages with tool_calls and tool results), turn by turn
    src/workbench/sim/corpus.json    the simulator's replies: the vocabulary and the text's ids

The vocabulary is real words only: the punctuation pre-tokens, then the words of the text,
then the prompt words below (ids in that order, from 0), and the special tokens at Kimi-K2.5's
own ids (<think> 163606, </think> 163607, <|im_end|> 163586, [EOS] 163585, ...). The simulator
writes its replies as runs of the text's sentences, so decoded outputs read as the book. Every
prompt text is built from these words and checked to encode without [UNK]. The pretokenized
file goes through the workbench's own tokenizer loader, so the script needs the `tokenizers`
extra (transformers).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from workbench.tokenizer import encode_messages, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "examples" / "text" / "alice_chapter_1.txt"
TEXT_SOURCE = "Lewis Carroll, Alice's Adventures in Wonderland (1865), chapter I; public domain"
SIM_DIR = ROOT / "src" / "workbench" / "sim"
SEED = 20250101
TOOL_TURNS_SEED = 20250102
TOOL_TURNS_ROWS = 120
PRE_TOKEN = re.compile(r"\w+|[^\w\s]+")  # the Whitespace pre-tokeniser's split
UNK = "[UNK]"
Messages = list[dict[str, str]]

# Kimi-K2.5's special tokens at their real ids.
SPECIAL_TOKENS: dict[str, int] = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|start_header_id|>": 163590,
    "<|end_header_id|>": 163591,
    "[EOT]": 163593,
    "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601,
    "<think>": 163606,
    "</think>": 163607,
    UNK: 163838,
    "[PAD]": 163839,
}

# Kimi-K2.5's chat template, reduced to text (its published chat_template.jinja; images and
# the TypeScript-style tool declaration left out). Turns are role marker, role name,
# <|im_middle|>, content, <|im_end|>; a default system prompt comes first when the messages do
# not start with one. Assistant turns up to the last one without tool calls are history: they
# render an empty <think></think> and their `content`, never `reasoning_content`; only later
# ones carry `<think>{reasoning_content}</think>` (unless `thinking` is false). The generation
# prompt opens the reasoning block (<think>) unless `thinking` is false (<think></think>).
CHAT_TEMPLATE = (
    "{%- macro set_roles(message) -%}"
    "{%- set role_name = message.get('name') or message['role'] -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>"
    "{%- else -%}<|im_system|>{{ role_name }}<|im_middle|>"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro render_toolcalls(message) -%}"
    "<|tool_calls_section_begin|>"
    "{%- for tool_call in message['tool_calls'] -%}"
    "<|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>"
    "{%- if tool_call['function']['arguments'] is string -%}"
    "{{ tool_call['function']['arguments'] }}"
    "{%- else -%}{{ tool_call['function']['arguments'] | tojson }}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endmacro -%}"
    "{%- set ns = namespace(last_non_tool_call_assistant_msg=-1) -%}"
    "{%- for idx in range(messages | length - 1, -1, -1) -%}"
    "{%- if ns.last_non_tool_call_assistant_msg == -1 and messages[idx]['role'] == 'assistant'"
    " and not messages[idx].get('tool_calls') -%}"
    "{%- set ns.last_non_tool_call_assistant_msg = idx -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set hist_msgs = messages[:ns.last_non_tool_call_assistant_msg + 1] -%}"
    "{%- set suffix_msgs = messages[ns.last_non_tool_call_assistant_msg + 1:] -%}"
    "{%- if tools -%}"
    "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
    "{%- endif -%}"
    "{%- if messages | length == 0 or messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
    "<|im_end|>"
    "{%- endif -%}"
    "{%- for message in hist_msgs -%}"
    "{{ set_roles(message) }}"
    "{%- if message['role'] == 'assistant' -%}"
    "<think></think>{{ message['content'] or '' }}"
    "{%- if message.get('tool_calls') -%}{{ render_toolcalls(message) }}{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "## Return of {{ message['tool_call_id'] }}\n{{ message['content'] }}"
    "{%- else -%}{{ message['content'] or '' }}"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- for message in suffix_msgs -%}"
    "{{ set_roles(message) }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- if thinking is defined and thinking is false -%}"
    "<think></think>{{ message['content'] or '' }}"
    "{%- else -%}"
    "<think>{{ message.get('reasoning_content') or '' }}</think>{{ message['content'] or '' }}"
    "{%- endif -%}"
    "{%- if message.get('tool_calls') -%}{{ render_toolcalls(message) }}{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "## Return of {{ message['tool_call_id'] }}\n{{ message['content'] }}"
    "{%- else -%}{{ message['content'] or '' }}"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>"
    "{%- else -%}<think>"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Pre-tokens made of punctuation (the whitespace pre-tokeniser splits on \w+|[^\w\s]+).
PUNCTUATION = (
    '. , ? ! : ; \' " ( ) [ ] { } - + * / = < > _ # ` % & @ | ~ ", ": }, ): () [] += == -= != ```'
).split()

WORDS = """
you are kimi an ai assistant created by moonshot system user tool tool_declare
a the this that these those some any each every all no other another same such
i we they he she it me us them my our your their its his her
is was be been being have has had do does did can could will would should may might must
and or but if then else when while because so as than also not only just very more most
of in on at to for with from into over under about after before between through during without
what which who how why where there here now today tomorrow yesterday again still already
make use find get give take show tell ask help need want know think look write read run
build test check fix add remove change update create delete send call return print explain
describe compare summarize list count sort filter parse convert calculate compute handle store
load save open close start stop keep move set track search book plan order pay cost include
makes uses finds gets gives takes shows needs wants writes reads checks fixes adds removes
changes updates creates sends returns explains describes compares counts computes parses
merges splits groups keeps retries stores loads saves opens tracks handles includes
report team project meeting data file files code function functions method class module value
values list lists string strings number numbers key keys item items result results error errors
question answer problem solution example examples step steps case cases time day days week weeks
month months year years hour hours minute minutes city cities country price prices money bank
account user users customer customers order orders product products service services message
messages email emails document documents page pages text word words line lines name names
book books story stories world people person life work home school market company plan plans
weather temperature rain sun wind travel flight flights hotel trip ticket tickets restaurant
restaurants food recipe recipes dinner lunch breakfast movie movies music song news history
science art details access language characters chunks intervals palindrome payment
small large big little new old good bad great long short high low fast slow simple clear
important different possible available current recent early late best better first last next
main final full free open public private local global general common special real true false
helpful careful following given latest highest monthly moving random top
quickly carefully clearly simply please thank thanks hello yes
one two three four five six seven eight nine ten hundred thousand
monday tuesday wednesday thursday friday saturday sunday
january february march april may june july august september october november december
paris london tokyo berlin madrid rome sydney toronto chicago boston seattle denver austin
usd eur gbp jpy cad aud
aapl msft goog amzn nvda tsla
english french spanish german italian japanese
python javascript typescript go rust java sql bash
def import none self lambda yield async await try except finally raise pass
elif break continue int str float bool dict tuple len range enumerate zip sorted append extend
pop const let var null undefined console log fn mut impl pub struct enum match vec
select group having limit insert table tables column columns row rows
index query queries database cache server client request requests response responses
input output inputs outputs config path paths json yaml csv http api url status level levels
logger logs event events queue worker workers thread threads job jobs batch size total
average max min sum mean median unique duplicate duplicates empty missing invalid valid
recursive iterative linear binary tree node nodes graph edge edges stack heap array arrays
matrix vector space complexity performance memory speed bug bugs crash
unit integration tests docstring type hints comments readable
refactor optimize implement design review debug validate merge split reverse
word_count parse_log merge_intervals top_k_words is_palindrome dedupe chunk read_csv
moving_average binary_search group_by retry backoff
get_weather convert_currency search_flights calculate_loan_payment get_stock_price
send_email create_calendar_event search_recipes translate_text get_news_headlines
calculate_bmi find_restaurants generate_password get_movie_details track_package calculate_tip
location unit celsius fahrenheit amount from_currency to_currency origin destination date
principal interest_rate term_months symbol recipient subject body title duration_minutes
ingredients diet source_language target_language topic weight_kg height_m cuisine max_price
length include_symbols tracking_number bill_amount tip_percentage
object integer boolean properties parameters required description type name
alice bob carol dave example com
chicken rice tomato cheese pasta beans garlic onion vegetarian vegan mexican
thai indian sushi pizza burger technology sports business health politics
password symbols package tip bmi loan stock calendar currency headlines
bill height weight mass interest rate percent tracking translate generate named k kg m
"""

NUMBERS = [str(n) for n in range(101)] + [
    *("120", "150", "180", "200", "250", "300", "365", "400", "500", "750"),
    *("1000", "1500", "2000", "2023", "2024", "2025", "5000", "10000"),
]


# ----------------------------------------------------------------------------- tokenizer


def pre_tokens(text: str) -> list[str]:
    """`text` split as the tokenizer splits it (lowercased, words and punctuation runs)."""
    return PRE_TOKEN.findall(text.lower())


def build_vocab(text: str) -> dict[str, int]:
    """token -> id: punctuation, the text's words, the prompt words, then special tokens."""
    pieces = pre_tokens(text)
    punctuation = PUNCTUATION + [p for p in pieces if not p[0].isalnum() and p[0] != "_"]
    words = [p for p in pieces if p[0].isalnum() or p[0] == "_"] + WORDS.split() + NUMBERS
    tokens = list(dict.fromkeys(punctuation + words))
    return {token: i for i, token in enumerate(tokens)} | SPECIAL_TOKENS


def sim_corpus(text: str, vocab: dict[str, int]) -> dict[str, Any]:
    """What the simulator writes replies from: its vocabulary and the text as ids."""
    tokens = [token for token, i in sorted(vocab.items(), key=lambda item: item[1])]
    return {
        "source": TEXT_SOURCE,
        "tokens": tokens[: len(vocab) - len(SPECIAL_TOKENS)],
        "text_ids": [vocab[piece] for piece in pre_tokens(text)],
    }


def tokenizer_json(vocab: dict[str, int]) -> dict[str, Any]:
    """The `tokenizers` serialisation, written by hand so its bytes never depend on a version."""
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    added = [
        {"id": i, "content": token, **flags, "special": True} for token, i in SPECIAL_TOKENS.items()
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK},
    }


def tokenizer_config() -> dict[str, Any]:
    """transformers' tokenizer_config.json: special token names and the chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": UNK,
        "pad_token": "[PAD]",
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def unknown_words(texts: Iterable[str], vocab: dict[str, int]) -> set[str]:
    """Pre-tokens of `texts` outside the vocabulary (they would encode as [UNK])."""
    pieces = {p for text in texts for p in pre_tokens(text)}
    return pieces - vocab.keys()


# ---------------------------------------------------------------------------------- text

SLOTS: dict[str, list[str]] = {
    "city": "Paris London Tokyo Berlin Madrid Rome Sydney Toronto Chicago Boston Seattle".split(),
    "currency": "USD EUR GBP JPY CAD AUD".split(),
    "stock": "AAPL MSFT GOOG AMZN NVDA TSLA".split(),
    "person": "alice bob carol dave".split(),
    "day": "monday tuesday wednesday thursday friday saturday sunday".split(),
    "food": "chicken rice tomato cheese pasta beans garlic onion".split(),
    "language": "French Spanish German Italian Japanese English".split(),
    "topic": "technology sports business health politics science".split(),
    "cuisine": "italian mexican thai indian sushi pizza".split(),
    "year": ["2000", "2023", "2024", "2025"],
    "number": NUMBERS,
    "small": NUMBERS[1:11],
    "percent": NUMBERS[10:31],
    "minutes": ["15", "30", "45", "60", "90", "120"],
    "kg": NUMBERS[50:101],
    "cm": NUMBERS[50:100],
    "chars": NUMBERS[8:33],
    "noun": (
        "report team project meeting data file function result error question answer problem "
        "solution example city price account customer order product service message document "
        "page story market company plan trip ticket restaurant recipe movie song book server "
        "client request response database table query cache worker thread job batch event queue"
    ).split(),
    "verb": (
        "makes uses finds gets gives takes shows needs wants checks fixes adds removes changes "
        "updates creates sends returns explains describes compares stores loads saves opens "
        "tracks handles includes"
    ).split(),
    "adjective": (
        "small large big little new old good bad great long short high low fast slow simple "
        "clear important different possible available current recent early late main final "
        "full free open public private local global general common special real"
    ).split(),
    "preposition": "of in on at to for with from into over under about after before".split(),
    "determiner": "a the this that every each some another".split(),
    "adverb": "quickly carefully clearly simply again still already now".split(),
}


class Words:
    """Seeded text builder over the vocabulary's words."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, slot: str) -> str:
        return self.rng.choice(SLOTS[slot])

    def fill(self, template: str) -> str:
        """`template` with each {slot} replaced by a random word of that slot."""
        return re.sub(r"\{(\w+)\}", lambda m: self.pick(m[1]), template)

    def phrase(self) -> str:
        adjective = "{adjective} " if self.rng.random() < 0.5 else ""
        return self.fill(f"{{determiner}} {adjective}{{noun}}")

    def sentence(self) -> str:
        words = f"{self.phrase()} {self.pick('verb')} {self.phrase()}"
        if self.rng.random() < 0.6:
            words += f" {self.pick('preposition')} {self.phrase()}"
        if self.rng.random() < 0.3:
            words += f" {self.pick('adverb')}"
        return words[0].upper() + words[1:] + "."

    def paragraph(self, sentences: int) -> str:
        return " ".join(self.sentence() for _ in range(sentences))

    def document(self, paragraphs: int) -> str:
        return "\n\n".join(self.paragraph(self.rng.randint(3, 8)) for _ in range(paragraphs))


# ------------------------------------------------------------------------ function calling


class Tool(NamedTuple):
    """A tool schema as glaive system prompts list it, and a user request that calls it."""

    schema: dict[str, Any]
    ask: str


def tool(name: str, description: str, ask: str, required: list[str], **params: str) -> Tool:
    """`params` maps each parameter to "type: description"."""
    properties: dict[str, Any] = {}
    for param, spec in params.items():
        kind, text = spec.split(": ", 1)
        items = {"items": {"type": "string"}} if kind == "array" else {}
        properties[param] = {"type": kind, **items, "description": text}
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool({"name": name, "description": description, "parameters": parameters}, ask)


TOOLS = [
    tool("get_weather", "Get the current weather for a city",
         "What is the weather in {city} today?", ["location"],
         location="string: The city name",
         unit="string: The temperature unit, celsius or fahrenheit"),
    tool("convert_currency", "Convert an amount from one currency to another",
         "Can you convert {number} {currency} to {currency} please?",
         ["amount", "from_currency", "to_currency"],
         amount="number: The amount to convert",
         from_currency="string: The currency to convert from",
         to_currency="string: The currency to convert to"),
    tool("search_flights", "Search flights between two cities on a date",
         "Find flights from {city} to {city} next {day}.", ["origin", "destination"],
         origin="string: The city to start from",
         destination="string: The city to travel to",
         date="string: The day of travel"),
    tool("calculate_loan_payment", "Calculate the monthly payment of a loan",
         "I want a loan of {number} for {number} months at {small} percent. "
         "What is the monthly payment?", ["principal", "interest_rate", "term_months"],
         principal="number: The loan amount",
         interest_rate="number: The interest rate",
         term_months="integer: The length of the loan in months"),
    tool("get_stock_price", "Get the current price of a stock",
         "What is the current price of {stock} stock?", ["symbol"],
         symbol="string: The stock symbol"),
    tool("send_email", "Send an email to a recipient",
         "Send an email to {person}@example.com about the {noun}.",
         ["recipient", "subject", "body"],
         recipient="string: The email of the recipient",
         subject="string: The subject of the email",
         body="string: The text of the email"),
    tool("create_calendar_event", "Create an event in the calendar",
         "Create a meeting on {day} for {minutes} minutes about the {noun}.", ["title", "date"],
         title="string: The title of the event",
         date="string: The date of the event",
         duration_minutes="integer: The length of the event in minutes"),
    tool("search_recipes", "Search recipes by ingredients",
         "I have {food} and {food}. Can you find a recipe for dinner?", ["ingredients"],
         ingredients="array: The ingredients to use",
         diet="string: A diet such as vegetarian or vegan"),
    tool("translate_text", "Translate a text to another language",
         "Translate this to {language}: the {adjective} {noun} is {adjective}.",
         ["text", "target_language"],
         text="string: The text to translate",
         source_language="string: The language of the text",
         target_language="string: The language to translate to"),
    tool("get_news_headlines", "Get the latest news headlines",
         "Show me the latest {topic} news.", ["topic"],
         topic="string: The topic of the news",
         country="string: The country of the news"),
    tool("calculate_bmi", "Calculate the body mass index",
         "My weight is {kg} kg and my height is 1.{cm} m. What is my bmi?",
         ["weight_kg", "height_m"],
         weight_kg="number: The weight in kg",
         height_m="number: The height in m"),
    tool("find_restaurants", "Find restaurants in a city",
         "Find a good {cuisine} restaurant in {city} for lunch.", ["location"],
         location="string: The city name",
         cuisine="string: The type of food",
         max_price="integer: The highest price"),
    tool("generate_password", "Generate a new random password",
         "I need a new password with {chars} characters.", ["length"],
         length="integer: The length of the password",
         include_symbols="boolean: Include symbols or not"),
    tool("get_movie_details", "Get details about a movie",
         "Tell me about the movie the {adjective} {noun} from {year}.", ["title"],
         title="string: The title of the movie",
         year="integer: The year of the movie"),
    tool("track_package", "Track the status of a package",
         "Where is my package? The tracking number is {number} {number}.", ["tracking_number"],
         tracking_number="string: The tracking number"),
    tool("calculate_tip", "Calculate the tip for a bill",
         "The bill is {number} and I want to give a {percent} percent tip.",
         ["bill_amount", "tip_percentage"],
         bill_amount="number: The total of the bill",
         tip_percentage="number: The tip in percent"),
]  # fmt: skip


def glaive_messages(w: Words) -> Messages:
    """A system prompt listing 1-4 tool schemas, and a user turn that calls for one of them."""
    chosen = [TOOLS[i] for i in w.rng.sample(range(len(TOOLS)), w.rng.randint(1, 4))]
    schemas = "\n".join(json.dumps(t.schema, indent=4) for t in chosen)
    system = (
        "You are a helpful assistant with access to the following functions. "
        f"Use them if required -\n{schemas}"
    )
    context = w.paragraph(w.rng.randint(1, 6)) + " " if w.rng.random() < 0.4 else ""
    ask = context + w.fill(w.rng.choice(chosen).ask)
    return [{"role": "system", "content": system}, {"role": "user", "content": ask}]


# ------------------------------------------------------------------- function-calling turns

# A value per parameter: a slot of SLOTS, "=word" for that word, "sentence", "email",
# "bool", "height" or "foods" (a list); a parameter not listed takes a noun.
ARGUMENT_SLOTS = {
    "location": "city", "unit": "=celsius", "amount": "number", "from_currency": "currency",
    "to_currency": "currency", "origin": "city", "destination": "city", "date": "day",
    "principal": "number", "interest_rate": "small", "term_months": "number",
    "symbol": "stock", "recipient": "email", "subject": "noun", "body": "sentence",
    "title": "noun", "duration_minutes": "minutes", "ingredients": "foods",
    "diet": "=vegetarian", "text": "sentence", "source_language": "language",
    "target_language": "language", "topic": "topic", "country": "city",
    "weight_kg": "kg", "height_m": "height", "cuisine": "cuisine", "max_price": "number",
    "length": "chars", "include_symbols": "bool", "year": "year",
    "tracking_number": "number", "bill_amount": "number", "tip_percentage": "percent",
}  # fmt: skip

# What each tool returns: result field -> value slot (as ARGUMENT_SLOTS).
RESULT_SLOTS: dict[str, dict[str, str]] = {
    "get_weather": {"temperature": "small", "unit": "=celsius", "rain": "bool"},
    "convert_currency": {"amount": "number", "currency": "currency"},
    "search_flights": {"flights": "small", "price": "number", "currency": "currency"},
    "calculate_loan_payment": {"payment": "number", "total": "number"},
    "get_stock_price": {"symbol": "stock", "price": "number", "currency": "=usd"},
    "send_email": {"status": "=true"},
    "create_calendar_event": {"status": "=created", "title": "noun", "date": "day"},
    "search_recipes": {"recipes": "foods", "minutes": "minutes"},
    "translate_text": {"text": "sentence", "language": "language"},
    "get_news_headlines": {"headlines": "sentences", "topic": "topic"},
    "calculate_bmi": {"bmi": "percent"},
    "find_restaurants": {"name": "noun", "cuisine": "cuisine", "price": "small"},
    "generate_password": {"password": "word", "length": "chars"},
    "get_movie_details": {"title": "noun", "year": "year"},
    "track_package": {"status": "adjective", "location": "city"},
    "calculate_tip": {"tip": "small", "total": "number"},
}  # fmt: skip

DIRECT_ASKS = ["Explain why {determiner} {noun} {verb} {determiner} {noun}.",
               "Thank you. Can you tell me more about the {adjective} {noun}?",
               "What is the {adjective} {noun} of {determiner} {noun}?"]  # fmt: skip


def slot_value(w: Words, slot: str) -> Any:
    """A JSON value for a slot of ARGUMENT_SLOTS / RESULT_SLOTS."""
    if slot.startswith("="):
        word = slot[1:]
        return {"true": True, "false": False}.get(word, word)
    if slot == "bool":
        return w.rng.random() < 0.5
    if slot == "email":
        return f"{w.pick('person')}@example.com"
    if slot == "height":
        return float(f"1.{w.pick('cm')}")
    if slot in ("sentence", "sentences"):
        sentences = [w.sentence().rstrip(".") for _ in range(1 if slot == "sentence" else 2)]
        return sentences[0] if slot == "sentence" else sentences
    if slot in ("foods", "word"):
        return [w.pick("food"), w.pick("food")] if slot == "foods" else w.pick("noun")
    value = w.pick(slot)
    return int(value) if value.isdigit() else value


def spaced_json(value: Any) -> str:
    """JSON text with a space inside each bracket (`{ "a": [ 1 ] }`), so that the example
    tokenizer splits every punctuation run into known pre-tokens."""
    if isinstance(value, dict):
        return f"{{ {joined([f'{json.dumps(k)}: {spaced_json(v)}' for k, v in value.items()])} }}"
    if isinstance(value, list):
        return f"[ {joined([spaced_json(v) for v in value])} ]"
    return json.dumps(value, ensure_ascii=False)


def joined(items: list[str]) -> str:
    """Items comma-separated; a comma after a bracket gets a space before it (`] ,`)."""
    return "".join(
        item + ("" if at == len(items) - 1 else " , " if item[-1] in "]}" else ", ")
        for at, item in enumerate(items)
    )


def call_arguments(w: Words, chosen: Tool) -> dict[str, Any]:
    """The required parameters and, for half of the calls, the optional ones (a string
    parameter's number as a string)."""
    parameters = chosen.schema["parameters"]
    optional = w.rng.random() < 0.5
    arguments = {}
    for name, spec in parameters["properties"].items():
        if name in parameters["required"] or optional:
            value = slot_value(w, ARGUMENT_SLOTS.get(name, "noun"))
            arguments[name] = str(value) if spec["type"] == "string" else value
    return arguments


def tool_turn(w: Words, tools: list[Tool], first_call: int) -> Messages:
    """A user turn naming one tool's subject (two for a share), the assistant's calls, the
    tool results and the assistant's answer."""
    chosen = [w.rng.choice(tools)]
    if w.rng.random() < 0.15:
        chosen.append(w.rng.choice(tools))
    asks = [w.fill(one.ask) for one in chosen]
    ask = " Also, ".join([asks[0], *(a[0].lower() + a[1:] for a in asks[1:])])
    calls, results = [], []
    for number, one in enumerate(chosen, first_call):
        name = one.schema["name"]
        arguments = spaced_json(call_arguments(w, one))
        calls.append({"id": f"call_{number}", "type": "function",
                      "function": {"name": name, "arguments": arguments}})
        result = {key: slot_value(w, slot) for key, slot in RESULT_SLOTS[name].items()}
        results.append({"role": "tool", "tool_call_id": f"call_{number}", "name": name,
                        "content": spaced_json(result)})
    answer = f"Here is what I found. {w.sentence()}"
    return [{"role": "user", "content": ask},
            {"role": "assistant", "content": "", "tool_calls": calls},
            *results, {"role": "assistant", "content": answer}]  # fmt: skip


def direct_turn(w: Words) -> Messages:
    """A user turn the assistant answers without a tool."""
    ask = w.fill(w.rng.choice(DIRECT_ASKS))
    return [{"role": "user", "content": ask[0].upper() + ask[1:]},
            {"role": "assistant", "content": w.paragraph(w.rng.randint(1, 3))}]


def tool_turns_row(w: Words, sample_id: int) -> dict[str, Any]:
    """A conversation of 1-3 user turns over 1-3 declared tools (OpenAI layout)."""
    tools = [TOOLS[i] for i in w.rng.sample(range(len(TOOLS)), w.rng.randint(1, 3))]
    messages: Messages = [{"role": "system", "content": "You are a helpful assistant. "
                           "Use the functions when they help."}]
    calls = 0
    for _ in range(w.rng.randint(1, 3)):
        turn = tool_turn(w, tools, calls + 1) if w.rng.random() < 0.8 else direct_turn(w)
        calls += sum(len(m.get("tool_calls", ())) for m in turn)
        messages += turn
    schemas = [{"type": "function", "function": t.schema} for t in tools]
    return {"sample_id": f"tools-{sample_id:04d}", "tools": schemas, "messages": messages}


# ------------------------------------------------------------------------------------ code

CODE_FUNCTIONS = {
    "word_count": "returns the number of words in a text",
    "parse_log": "parses each log line and counts the errors by level",
    "merge_intervals": "merges the intervals of a list and returns the result",
    "top_k_words": "returns the top k words of a text by count",
    "is_palindrome": "checks if a string is a palindrome",
    "dedupe": "removes the duplicates from a list and keeps the order",
    "chunk": "splits a list into chunks of a given size",
    "read_csv": "reads a csv file and returns the rows as a list of dict",
    "moving_average": "computes the moving average of a list of numbers",
    "binary_search": "finds a value in a sorted array with binary search",
    "group_by": "groups the items of a list by key",
    "retry": "retries a request with backoff when the server returns an error",
}
CODE_LANGUAGES = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java"]
CODE_ASKS = [
    "Use type hints and write a docstring.",
    "Add unit tests for the edge cases.",
    "Explain the time and space complexity.",
    "Keep the code simple and readable.",
    "Handle empty input and invalid values.",
    "Do not use any import.",
]
CODE_FUNCTION = """\
def {name}({arg}, {other}):
    result = []
    for item in {arg}:
        if item == {other}:
            continue
        result.append(item)
    {counter} += {digit}
    return sorted(result)"""


def code_listing(w: Words, functions: int) -> str:
    """A Python listing of `functions` small functions built from the vocabulary's words."""
    return "\n\n".join(
        CODE_FUNCTION.format(
            name=w.rng.choice(list(CODE_FUNCTIONS)),
            arg=w.rng.choice(("items", "values", "rows", "lines")),
            other=w.rng.choice(("key", "size", "limit", "total")),
            counter=w.rng.choice(("total", "count", "size")),
            digit=w.rng.choice(NUMBERS[:10]),
        )
        for _ in range(functions)
    )


def code_messages(w: Words, long: bool) -> Messages:
    """A code instruction; some come with a listing to review, long ones with a long listing."""
    name, purpose = w.rng.choice(list(CODE_FUNCTIONS.items()))
    asks = "".join(f" {a}" for a in w.rng.sample(CODE_ASKS, w.rng.randint(0, 3)))
    text = f"Write a {w.rng.choice(CODE_LANGUAGES)} function named {name} that {purpose}.{asks}"
    if long or w.rng.random() < 0.3:
        listing = code_listing(w, w.rng.randint(60, 120) if long else w.rng.randint(1, 6))
        text = f"Review the following code and fix the bugs.{asks}\n\n```python\n{listing}\n```"
    user = {"role": "user", "content": text}
    if w.rng.random() < 0.5:
        system = "You are a careful assistant that writes clear code."
        return [{"role": "system", "content": system}, user]
    return [user]


# ------------------------------------------------------------------------ chat and texts


def chat_messages(w: Words, report_paragraphs: int) -> Messages:
    """A question, or with `report_paragraphs` a report to summarise."""
    if report_paragraphs:
        text = f"Summarize the following report.\n\n{w.document(report_paragraphs)}"
    else:
        ask = w.rng.choice(("Explain", "Describe", "Summarize", "Compare", "Review"))
        text = f"{ask} why {w.sentence().lower()} {w.paragraph(w.rng.randint(0, 12))}".rstrip()
    return [{"role": "user", "content": text}]


def story_text(w: Words) -> str:
    """A raw text to continue (the `text` input mode sends it as is)."""
    return f"Continue the following story.\n\n{w.document(w.rng.randint(1, 4))}"


# ------------------------------------------------------------------------------- writing


def build_rows(w: Words) -> dict[str, list[dict[str, Any]]]:
    """Rows of each data file; the pretokenized one still holds messages."""
    chat_sizes = [
        w.rng.randint(85, 120) if i % 25 == 24 else w.rng.choice((0, 0, 0, 1, 2, 4))
        for i in range(300)
    ]
    return {
        "glaive_fc.jsonl": [{"sample_id": i, "messages": glaive_messages(w)} for i in range(300)],
        "code_instruct.jsonl": [
            {"sample_id": f"code-{i:04d}", "messages": code_messages(w, long=i % 60 == 59)}
            for i in range(300)
        ],
        "pretokenized.jsonl": [
            {"sample_id": i, "messages": chat_messages(w, size)}
            for i, size in enumerate(chat_sizes)
        ],
        "texts.jsonl": [{"sample_id": i, "text": story_text(w)} for i in range(50)],
    }


def row_texts(rows: Iterable[dict[str, Any]]) -> Iterable[str]:
    for row in rows:
        for message in row.get("messages", ()):
            yield message["content"]
            yield from (call["function"]["arguments"] for call in message.get("tool_calls", ()))
        if "text" in row:
            yield row["text"]


def pretokenize(rows: list[dict[str, Any]], tokenizer_dir: Path) -> list[dict[str, Any]]:
    """Rows of {sample_id, input_ids}: the messages rendered with thinking on."""
    tokenizer = load_tokenizer(tokenizer_dir)
    thinking = {"thinking": True}
    return [
        {
            "sample_id": row["sample_id"],
            "input_ids": encode_messages(tokenizer, row["messages"], thinking),
        }
        for row in rows
    ]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def jsonl_bytes(rows: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row, ensure_ascii=False).encode() + b"\n" for row in rows)


def make_examples(out: Path, sim_dir: Path = SIM_DIR) -> list[Path]:
    """Write the tokenizer and data files under `out` and the simulator's corpus in `sim_dir`."""
    text = TEXT.read_text(encoding="utf-8")
    vocab = build_vocab(text)
    files = [
        write(out / "tokenizer" / "tokenizer.json", json_bytes(tokenizer_json(vocab))),
        write(out / "tokenizer" / "tokenizer_config.json", json_bytes(tokenizer_config())),
        write(sim_dir / "corpus.json", json.dumps(sim_corpus(text, vocab)).encode() + b"\n"),
    ]
    data = build_rows(Words(random.Random(SEED)))
    turns = Words(random.Random(TOOL_TURNS_SEED))  # its own draws: the other files stay as they were
    data["tool_turns.jsonl"] = [tool_turns_row(turns, i) for i in range(TOOL_TURNS_ROWS)]
    missing = unknown_words((t for rows in data.values() for t in row_texts(rows)), vocab)
    if missing:
        raise SystemExit(f"words missing from the vocabulary: {sorted(missing)}")
    data["pretokenized.jsonl"] = pretokenize(data["pretokenized.jsonl"], out / "tokenizer")
    files += [write(out / "data" / name, jsonl_bytes(rows)) for name, rows in data.items()]
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the workbench's example data.")
    parser.add_argument("--out", type=Path, default=ROOT / "examples", help="default: examples/")
    args = parser.parse_args(argv)
    for path in make_examples(args.out):
        print(f"{path.stat().st_size:>9,d}  {path}")


if __name__ == "__main__":
    main()
