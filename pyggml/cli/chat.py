"""`pyggml chat`: a conversation in the terminal, as `llama-cli -cnv` or `ollama run`: the answer streams as it
is made, the model's chat template renders the history, the oldest turns are dropped (with a note) when the
context fills. Ctrl-C stops an answer and keeps the session; Ctrl-D or /exit ends it."""

from __future__ import annotations

import contextlib
import sys
import time

from pyggml.cli.model_options import add_model_options, add_sampling_options, open_model, sampling_params

HELP = """commands:
  /help          this text
  /clear         forget the conversation (the system prompt stays)
  /stats         load time and the last answer's speed
  /image PATH    send this image with the next message (needs --mmproj)
  /exit, /quit   end the session (or Ctrl-D)
input: end a line with \\ to go on to the next; or put the message between lines of \"\"\".
Ctrl-C stops the answer being written and keeps the session."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("chat", help="chat with a GGUF model in the terminal")
    add_model_options(p)
    p.add_argument("--system", "-sys", default=None, help="system prompt")
    p.add_argument("-n", "--max-tokens", dest="reply_room", type=int, default=-1,
                   help="tokens an answer may take, kept free in the context (-1: a quarter of the context)")
    add_sampling_options(p, temp=0.7)
    p.add_argument("--verbose", "-v", action="store_true", help="print the speed after every answer")
    p.set_defaults(run=run)


def read_message(read=None) -> str | None:
    """One message from the user: a line, lines joined by a trailing backslash, or a block between lines of
    \"\"\". None at the end of input (Ctrl-D). `read` defaults to input(), looked up at each call."""
    read = read or input
    try:
        line = read("> ")
        if line.strip() == '"""':
            lines = []
            while (line := read("... ")).strip() != '"""':
                lines.append(line)
            return "\n".join(lines)
        lines = []
        while line.endswith("\\"):
            lines.append(line[:-1])
            line = read("... ")
        return "\n".join(lines + [line])
    except EOFError:
        return None


def speed(conv, load_s: float) -> str:
    s = conv.last
    prompt = s["prompt_tokens"] / s["prompt_s"] if s["prompt_s"] else 0.0
    gen = s["gen_tokens"] / s["gen_s"] if s["gen_s"] else 0.0
    return (f"[load {load_s:.2f} s; prompt {s['prompt_tokens']} tokens at {prompt:.1f} tokens/s; answer "
            f"{s['gen_tokens']} tokens at {gen:.1f} tokens/s; context {len(conv.cached)}/{conv.model.n_ctx}]")


def attach_image(model, path: str, pending: list[str]) -> None:
    """/image PATH: the file as a data URL, sent with the next message."""
    from pyggml.models.vision.content import image_data_url

    if model.vision is None:
        print("[this model has no vision: start pyggml chat with --mmproj FILE]", file=sys.stderr)
        return
    if not path:
        print("[/image needs a file: /image PATH]", file=sys.stderr)
        return
    pending.append(image_data_url(path))
    print(f"[image {path} goes with the next message]", file=sys.stderr)


def answer(conv, text: str, images: list[str] = ()) -> None:
    """Stream the answer to stdout; Ctrl-C ends it early, keeping what was said."""
    pieces = conv.reply(text, images)
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
    except KeyboardInterrupt:
        pieces.close()
        print(" [stopped]", end="")
    finally:
        print(flush=True)
    if conv.dropped:
        print(f"[the context was full: the {conv.dropped} oldest message(s) were dropped]", file=sys.stderr)


class Session:
    """What the loop keeps between messages: the conversation, the load time /stats reports, and the images
    /image attached to the next message (as data URLs)."""

    def __init__(self, model, conv, load_s: float, verbose: bool):
        self.model, self.conv, self.load_s, self.verbose = model, conv, load_s, verbose
        self.images: list[str] = []

    def take(self, text: str) -> None:
        """One message: a command, or text for the model (a line starting with / that holds a space or a
        newline is text, so a message may begin with a path)."""
        command = text.strip()
        if command == "/image" or command.startswith("/image "):
            self.attach(command[len("/image"):].strip())
        elif command in COMMANDS:
            COMMANDS[command](self)
        elif command.startswith("/") and "\n" not in command and " " not in command:
            print(f"unknown command {command}; /help lists them", file=sys.stderr)
        elif command:
            self.send(text)

    def show_help(self) -> None:
        print(HELP, file=sys.stderr)

    def clear(self) -> None:
        self.conv.clear()
        print("[conversation cleared]", file=sys.stderr)

    def stats(self) -> None:
        print(speed(self.conv, self.load_s), file=sys.stderr)

    def attach(self, path: str) -> None:
        """/image PATH; a file that cannot be read is reported and the session goes on."""
        from pyggml.errors import ImageError

        try:
            attach_image(self.model, path, self.images)
        except ImageError as e:
            print(f"[{e}]", file=sys.stderr)

    def send(self, text: str) -> None:
        """The message and its attached images to the model, the answer streamed; a message the model refuses
        (too long for the context, an unreadable image) is reported and the session goes on."""
        from pyggml.errors import ImageError, ParameterError

        sent, self.images = self.images, []
        try:
            answer(self.conv, text, sent)
        except (ParameterError, ImageError) as e:
            print(f"[{e}]", file=sys.stderr)
            return
        if self.verbose:
            self.stats()


COMMANDS = {"/help": Session.show_help, "/clear": Session.clear, "/stats": Session.stats}
LEAVE = ("/exit", "/quit", "/bye")


def open_session(args) -> Session:
    """Load the model, saying what is loading and then how long it took (the wait is long for a big file)."""
    from pyggml.models.llm.conversation import Conversation

    params = sampling_params(args)
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    model = open_model(args)
    load_s = time.perf_counter() - start
    conv = Conversation(model, system=args.system, params=params, reply_room=args.reply_room)
    print(f"{model.gguf.path} ({model.architecture}, context {model.n_ctx}) loaded in {load_s:.1f} s. "
          f"/help for commands, Ctrl-D to leave.", file=sys.stderr, flush=True)
    return Session(model, conv, load_s, args.verbose)


def next_message() -> str | None:
    """read_message, asked again after a Ctrl-C at the prompt: Ctrl-C stops answers, never the session."""
    while True:
        try:
            return read_message()
        except KeyboardInterrupt:
            print("\n(Ctrl-D or /exit to leave)", file=sys.stderr)


def run(args) -> int:
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401 - line editing and history for input() where the platform has it
    session = open_session(args)
    while (text := next_message()) is not None:
        if text.strip() in LEAVE:
            return 0
        try:
            session.take(text)
        except KeyboardInterrupt:  # a Ctrl-C just outside an answer's stream (as the answer ended): the same stop
            print(" [stopped]", flush=True)
    print(file=sys.stderr)
    return 0
