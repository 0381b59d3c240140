"""Checks in a real browser that TensorBoard shows a logdir's scalars: starts
TensorBoard on a free loopback port, asks its HTTP API that every tag is
listed for some run, then opens the scalars dashboard in headless Chromium and
waits until every tag's name is on the page and its chart is drawn. With
--screenshot, saves the page with those charts expanded (the README's picture).

    PYTHONPATH=/root/.cache/tensortap/tensorboard-2.21.0-cp311 /usr/bin/python3 \\
        tests/python/check_tensorboard_browser.py LOGDIR --tags TAG [TAG ...] \\
        [--screenshot PNG] [--timeout S]

TensorBoard is run as `sys.executable -m tensorboard.main` (so it must be
importable by this Python, or set TT_TENSORBOARD to a command that runs it);
the browser is Debian's chromium with chromium-driver and python3-selenium.

A chart counts as drawn when its SVG line plot (TensorBoard 2.x's scalar card
draws with Plottable into SVG, not a canvas) has a visible series path through
at least two points inside a box of nonzero size, and when the pixels
Chromium painted for that chart include the series' own colour: the chart is
cut out of a screenshot and its pixels counted in the browser.

With --custom-scalars PNG, it then checks the Custom Scalars tab against
the layout TensorBoard merged from the runs' (writers/src/tensorboard/EVENTS.md,
"The layout"): the 0-d tensors first, a chart each (the loss's first);
every chart of 1 to 16 series, each an expression ^...$ that matches one
scalar tag of the runs; each chart's expressions through TensorBoard's
/scalars route as its card asks (joined), matching that many tags; each of
--custom-tags in some chart; every chart of the tab drawn, in the layout's
order, with that many series ("Matches (N)"); and saves that page.

Exits 0 when all is seen, 1 with what was seen when not, 2 on bad arguments.
It never waits past its deadline (--timeout, for the whole check), and always
stops TensorBoard (its whole process group) and the browser.
"""

import argparse
import base64
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import chromium

SIZE = (1280, 800)  # the page, and so the screenshot, unless --size

# TensorBoard's elements keep their insides in shadow roots: every lookup
# goes down through them.
_DEEP = """
function deep(root, sel, out) {
  out = out || [];
  out.push(...root.querySelectorAll(sel));
  for (const el of root.querySelectorAll('*')) if (el.shadowRoot) deep(el.shadowRoot, sel, out);
  return out;
}
"""

_CARDS = _DEEP + """
// The scalar cards of `tags`, the highest on the page for each (the tag
// filter's results come first), with their charts' series paths: how many
// points, how wide, what colour, whether shown.
const tags = arguments[0];
const out = {};
for (const card of deep(document, 'tf-scalar-card')) {
  if (!tags.includes(card.tag)) continue;
  const box = card.getBoundingClientRect();
  if (card.tag in out && out[card.tag].top <= box.top) continue;
  const series = [];
  for (const chart of deep(card.shadowRoot, 'vz-line-chart2')) {
    for (const path of deep(chart.shadowRoot || chart, 'path.line')) {
      const r = path.getBoundingClientRect();
      const style = getComputedStyle(path);
      const d = path.getAttribute('d') || '';
      series.push({points: (d.match(/[ML]/g) || []).length, w: r.width, h: r.height,
                   stroke: style.stroke, visible: style.display !== 'none' && style.visibility !== 'hidden'
                   && style.stroke !== 'none' && parseFloat(style.strokeOpacity || '1') > 0});
    }
  }
  out[card.tag] = {top: box.top, w: box.width, h: box.height, expanded: card.hasAttribute('_expanded'),
                   series: series};
}
return out;
"""

_CHART = _DEEP + """
const cards = deep(document, 'tf-scalar-card').filter(c => c.tag === arguments[0]);
cards.sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
return cards.length ? deep(cards[0].shadowRoot, 'vz-line-chart2')[0] || null : null;
"""

# Counts, in a PNG decoded by the browser, the pixels within `tolerance` of
# each of `colours` ([r, g, b]) and the distinct colours.
_PIXELS = """
const [png, colours, tolerance, done] = arguments;
const img = new Image();
img.onerror = () => done({error: 'the screenshot does not decode'});
img.onload = () => {
  const c = document.createElement('canvas');
  c.width = img.width; c.height = img.height;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data;
  const counts = colours.map(() => 0), distinct = new Set();
  for (let i = 0; i < px.length; i += 4) {
    distinct.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
    colours.forEach((rgb, k) => {
      if (Math.abs(px[i] - rgb[0]) + Math.abs(px[i + 1] - rgb[1]) + Math.abs(px[i + 2] - rgb[2]) <= tolerance)
        counts[k]++;
    });
  }
  done({w: c.width, h: c.height, counts: counts, distinct: distinct.size});
};
img.src = 'data:image/png;base64,' + png;
"""

_EXPAND = _DEEP + """
// Expands the highest card of each tag (the tag filter's results).
const cards = deep(document, 'tf-scalar-card').filter(c => arguments[0].includes(c.tag));
cards.sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
const seen = new Set();
for (const card of cards) {
  if (seen.has(card.tag)) continue;
  seen.add(card.tag);
  const button = card.shadowRoot.querySelector('paper-icon-button[icon="fullscreen"]');
  if (button && !card.hasAttribute('_expanded')) button.click();
}
return seen.size;
"""


_CUSTOM = _DEEP + """
// The custom scalars tab's chart cards: title, box, series paths.
const out = [];
for (const card of deep(document, 'tf-custom-scalar-multi-line-chart-card')) {
  const box = card.getBoundingClientRect();
  const series = [];
  for (const chart of deep(card.shadowRoot, 'vz-line-chart2'))
    for (const path of deep(chart.shadowRoot || chart, 'path.line')) {
      const r = path.getBoundingClientRect();
      const style = getComputedStyle(path);
      series.push({points: ((path.getAttribute('d') || '').match(/[ML]/g) || []).length, w: r.width,
                   visible: style.display !== 'none' && style.visibility !== 'hidden' && style.stroke !== 'none'});
    }
  // The card's series (its "Matches (N)"): one per run and tag its expressions match.
  out.push({title: card.title, w: box.width, h: box.height, series: series,
            matches: (card._seriesNames || []).length});
}
return out;
"""

SERIES_PER_CHART = 16  # EVENTS.md, "The layout"


class Failed(Exception):
    pass


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self, at_least=0.1):
        left = self.end - time.monotonic()
        if left <= 0:
            raise Failed("ran out of time")
        return max(left, at_least)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class TensorBoard:
    """TensorBoard on 127.0.0.1:`port`, in its own process group, its output
    in a log file."""

    def __init__(self, logdir, port, workdir):
        command = shlex.split(os.environ["TT_TENSORBOARD"]) if os.environ.get("TT_TENSORBOARD") else \
            [sys.executable, "-m", "tensorboard.main"]
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(workdir, "tensorboard.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(command + ["--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, deadline):
        last = None
        while True:
            if self.proc.poll() is not None:
                raise Failed(f"TensorBoard exited with status {self.proc.returncode} before it answered")
            try:
                get_json(self.url + "/data/logdir", timeout=min(2, deadline.left()))
                return
            except (urllib.error.URLError, OSError, ValueError) as e:
                last = e
            if deadline.end - time.monotonic() < 0.25:
                raise Failed(f"TensorBoard did not answer at {self.url}: {last}")
            time.sleep(0.25)

    def tags(self, wanted, deadline):
        """{tag: [runs]} as the scalars plugin lists them, once all of
        `wanted` are there (TensorBoard loads the logdir in the background)."""
        while True:
            listed = {}
            try:
                runs = get_json(self.url + "/data/plugin/scalars/tags", timeout=min(5, deadline.left()))
                for run, tags in runs.items():
                    for tag in tags:
                        listed.setdefault(tag, []).append(run)
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if all(t in listed for t in wanted) or deadline.end - time.monotonic() < 0.5:
                return listed
            time.sleep(0.5)

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:  # what is left of the group: TensorBoard, its data server
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)
        self.log.close()

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")


def browser(workdir, deadline, size):
    try:
        driver = chromium.start(f"{workdir}/profile", size)
    except chromium.Missing as e:
        raise Failed(f"the browser check {e}")
    try:
        # The page exactly `size`, whatever the window's frame takes.
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False})
        driver.set_page_load_timeout(deadline.left(1))
        driver.set_script_timeout(min(30, deadline.left(1)))
    except BaseException:
        driver.quit()
        raise
    return driver


def tag_filter(tags):
    """A JavaScript regular expression that matches exactly `tags`."""
    special = set("\\^$.|?*+()[]{}")
    return "^(" + "|".join("".join("\\" + c if c in special else c for c in t) for t in tags) + ")$"


def rgb(css):
    """[r, g, b] of a computed colour such as 'rgb(0, 119, 187)', or None."""
    if not css.startswith("rgb"):
        return None
    return [int(float(v)) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3]]


def visible_text(driver):
    """The page's visible text, the insides of its elements' shadow roots
    included (WebDriver's element text goes through them; innerText does not)."""
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.TAG_NAME, "body").text or ""
    except Exception:  # noqa: BLE001 - only for the report
        return ""


def drawn(driver, tag, card):
    """Why the chart of `tag` does not look drawn, or None when it does:
    a visible series through two points or more, in a box of nonzero size,
    whose colour Chromium painted in the chart."""
    from selenium.common.exceptions import WebDriverException

    series = [s for s in card["series"] if s["visible"] and s["points"] >= 2 and s["w"] > 0 and rgb(s["stroke"])]
    if card["w"] <= 0 or card["h"] <= 0:
        return "the card has no size"
    if not series:
        return f"no visible series of 2 points or more in {len(card['series'])} paths"
    chart = driver.execute_script(_CHART, tag)
    if chart is None:
        return "no chart element"
    try:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", chart)
        png = base64.b64encode(chart.screenshot_as_png).decode()
    except WebDriverException as e:
        return f"no screenshot of the chart: {e.msg}"
    colours = [rgb(s["stroke"]) for s in series]
    pixels = driver.execute_async_script(_PIXELS, png, colours, 60)
    if "error" in pixels:
        return pixels["error"]
    card["pixels"] = pixels
    # A line of the series' colour, 30 pixels long or more, among other colours.
    if max(pixels["counts"]) < 30 or pixels["distinct"] < 4:
        return (f"the painted chart ({pixels['w']}x{pixels['h']}, {pixels['distinct']} colours) has "
                f"{max(pixels['counts'])} pixels of its series' colours")
    return None


def check(args, workdir, deadline, seen):
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    tb = TensorBoard(os.path.abspath(args.logdir), free_port(), workdir)
    seen["tensorboard"] = tb
    driver = None
    try:
        tb.wait_ready(deadline)
        listed = tb.tags(args.tags, deadline)
        seen["listed"] = listed
        missing = [t for t in args.tags if t not in listed]
        if missing:
            raise Failed(f"TensorBoard's API lists no run with the tags {missing}")

        driver = browser(workdir, deadline, args.size)
        seen["driver"] = driver
        url = f"{tb.url}/#scalars&tagFilter={urllib.parse.quote(tag_filter(args.tags), safe='')}"
        driver.get(url)
        state = {}

        def shown(driver):
            text = visible_text(driver)
            seen["title"] = driver.title
            cards = driver.execute_script(_CARDS, args.tags) or {}
            state.update(text=text, cards=cards, absent=[t for t in args.tags if t not in text or t not in cards])
            if state["absent"]:
                return False
            # A card has its chart and the chart its series (the data arrives
            # after the card); the others get a few seconds more below.
            return any(s["visible"] and s["points"] >= 2 for t in args.tags for s in cards[t]["series"])

        try:
            WebDriverWait(driver, deadline.left(), poll_frequency=0.25).until(shown)
        except TimeoutException:
            pass
        seen["state"] = state
        if state.get("absent"):
            raise Failed(f"the page does not show the tags {state['absent']}")
        # Let the last data arrive and be painted before judging the pixels.
        verdicts = {}
        end = min(deadline.end, time.monotonic() + 10)
        while True:
            cards = driver.execute_script(_CARDS, args.tags) or {}
            state["cards"] = cards
            verdicts = {t: drawn(driver, t, cards[t]) if t in cards else "no card" for t in args.tags}
            if all(v is None for v in verdicts.values()) or time.monotonic() > end:
                break
            time.sleep(0.5)
        seen["verdicts"] = verdicts
        ok = [t for t, v in verdicts.items() if v is None]
        if not ok:
            raise Failed("no chart is drawn: " + "; ".join(f"{t}: {v}" for t, v in verdicts.items()))

        if args.screenshot:
            driver.execute_script(_EXPAND, args.tags)
            driver.execute_script("window.scrollTo(0, 0);" + _DEEP +
                                  "for (const el of deep(document, '#center')) el.scrollTop = 0;")
            # The expanded charts draw again at their new size: wait for their
            # series to span most of it, then a moment for the paint.
            try:
                WebDriverWait(driver, min(10, deadline.left()), poll_frequency=0.25).until(
                    lambda d: all(c["expanded"] and any(s["visible"] and s["w"] > 0.5 * c["w"] for s in c["series"])
                                  for c in (d.execute_script(_CARDS, ok) or {}).values()))
            except TimeoutException:
                pass  # a screenshot of what is there is still worth having
            time.sleep(min(0.5, deadline.left()))
            os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
            if not driver.save_screenshot(args.screenshot):
                raise Failed(f"could not save the screenshot {args.screenshot}")
        if args.custom_scalars:
            seen["custom"] = custom_scalars(tb, driver, args, listed, deadline)
        return listed, verdicts, state["cards"]
    except WebDriverException as e:
        raise Failed(f"the browser failed: {e.msg or e}") from e
    finally:
        seen["title"] = _title(driver) or seen.get("title")
        if driver is not None:
            seen.setdefault("state", {}).setdefault("text", visible_text(driver))
            driver.quit()
        tb.stop()


def custom_scalars(tb, driver, args, listed, deadline):
    """The Custom Scalars tab: the layout TensorBoard merged from the runs'
    (EVENTS.md, "The layout"), each chart's expressions through the route
    its card asks (/scalars, joined as the card joins them), its charts
    drawn; then its screenshot. Returns [(category, chart, [tags matched])]."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    layout = get_json(tb.url + "/data/plugin/custom_scalars/layout", timeout=min(10, deadline.left()))
    categories = layout.get("category", [])
    titles = [c.get("title", "") for c in categories]
    if not categories:
        raise Failed(f"TensorBoard has no custom scalars layout: {layout}")
    scalars = [k for k, t in enumerate(titles) if t.startswith("tensortap: 0-d tensors")]
    if scalars and scalars != [0]:
        raise Failed(f"the custom scalars layout does not put the 0-d tensors first: {titles}")
    runs = sorted({r for rs in listed.values() for r in rs})
    all_tags = sorted(listed)
    matched = []
    lines = []
    for c in categories:
        for chart in c.get("chart", []):
            where = f"{c.get('title')} / {chart.get('title')}"
            regexes = chart.get("multiline", {}).get("tag", [])
            if not regexes or len(regexes) > SERIES_PER_CHART:
                raise Failed(f"{where}: {len(regexes)} series, not 1 to {SERIES_PER_CHART}")
            # One request a run, the expressions joined as the card joins them.
            joined = regexes[0] if len(regexes) == 1 else "|".join(f"({r})" for r in regexes)
            tags = set()
            series = 0  # (run, tag) pairs: the card's lines
            for run in runs:
                url = (tb.url + "/data/plugin/custom_scalars/scalars?"
                       + urllib.parse.urlencode({"tag": joined, "run": run}))
                data = get_json(url, timeout=min(10, deadline.left()))
                if not data.get("regex_valid"):
                    raise Failed(f"{where}: TensorBoard finds the regular expression {joined!r} invalid")
                tags |= set(data.get("tag_to_events", {}))
                series += len(data.get("tag_to_events", {}))
            # Each series one tag: anchored, escaped, matching its tag alone
            # among every scalar tag of the runs (the route's re.match).
            for r in regexes:
                hits = [t for t in all_tags if re.match(r, t)]
                if not (r.startswith("^") and r.endswith("$")) or len(hits) != 1:
                    raise Failed(f"{where}: the expression {r!r} matches {hits[:4]}, not one tag")
            if len(tags) != len(regexes):
                raise Failed(f"{where}: {len(regexes)} expressions, the route matches {len(tags)} tags "
                             f"{sorted(tags)[:4]}")
            matched.append((c["title"], chart.get("title", ""), sorted(tags)))
            lines.append(series)
    for category, chart, tags in matched:
        # A 0-d tensor's chart is its one scalar, never a tensor's statistic.
        if category.startswith("tensortap: 0-d tensors") and tags != [f"tensor/{chart}"]:
            raise Failed(f"the 0-d tensor chart {chart!r} matches {tags}")
    if "tensor/loss" in listed and matched[0][1] != "loss":
        raise Failed(f"the first chart is {matched[0][1]!r}, not the loss's")
    every = {t for _, _, ts in matched for t in ts}
    missing = [t for t in args.custom_tags or [] if t not in every]
    if missing:
        raise Failed(f"no custom scalars chart matches {missing}; the charts match {matched}")
    driver.get(f"{tb.url}/#custom_scalars")
    want = len(matched)
    state = {}

    def drawn_cards(d):
        # A card is drawn when it has as many visible lines of two points or
        # more as it has series (the data of each arrives on its own).
        cards = d.execute_script(_CUSTOM) or []
        state["cards"] = cards
        ok = [c for c in cards if c["w"] > 0 and c["matches"] > 0 and c["matches"] <= len(
            [s for s in c["series"] if s["visible"] and s["points"] >= 2 and s["w"] > 0])]
        state["drawn"] = len(ok)
        return cards if len(ok) >= want else False

    try:
        cards = WebDriverWait(driver, deadline.left(), poll_frequency=0.25).until(drawn_cards)
    except TimeoutException:
        raise Failed(f"the Custom Scalars tab draws {state.get('drawn')} of its {want} charts: "
                     f"{[(c['title'], c['matches'], len(c['series'])) for c in state.get('cards', [])]}") from None
    # The cards in the layout's order, each with the series its expressions
    # match through the route: one a run and tag.
    if [c["title"] for c in cards] != [chart for _, chart, _ in matched]:
        raise Failed(f"the tab's cards {[c['title'] for c in cards]} are not the layout's charts "
                     f"{[chart for _, chart, _ in matched]}")
    for (category, chart, tags), n, card in zip(matched, lines, cards):
        if card["matches"] != n:
            raise Failed(f"{category} / {chart}: the card has {card['matches']} series, the route gives {n}")
    time.sleep(min(1.0, deadline.left()))
    os.makedirs(os.path.dirname(os.path.abspath(args.custom_scalars)), exist_ok=True)
    if not driver.save_screenshot(args.custom_scalars):
        raise Failed(f"could not save the screenshot {args.custom_scalars}")
    for (category, chart, tags), card in zip(matched, cards):
        print(f"tensorboard: custom scalars: {category} / {chart}: {len(tags)} tags ({', '.join(tags[:4])}"
              f"{', ...' if len(tags) > 4 else ''}), {card['matches']} series drawn")
    return matched


def _title(driver):
    try:
        return driver.title if driver is not None else None
    except Exception:  # noqa: BLE001 - only for the report
        return None


def size(text):
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT")
    if not (200 <= w <= 4000 and 200 <= h <= 4000):
        raise argparse.ArgumentTypeError(f"{text!r}: between 200 and 4000 pixels a side")
    return w, h


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir")
    parser.add_argument("--tags", nargs="+", required=True, metavar="TAG")
    parser.add_argument("--screenshot", metavar="PNG")
    parser.add_argument("--size", type=size, default=SIZE, metavar="WxH",
                        help=f"of the page and the screenshot (default {SIZE[0]}x{SIZE[1]})")
    parser.add_argument("--custom-scalars", metavar="PNG", help="check the Custom Scalars tab and save it here")
    parser.add_argument("--custom-tags", nargs="+", metavar="TAG",
                        help="tags the custom scalars charts must show (with --custom-scalars)")
    parser.add_argument("--timeout", type=float, default=90, metavar="S",
                        help="for the whole check (default 90)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.logdir):
        parser.error(f"{args.logdir} is not a directory")

    import importlib.util
    if not os.environ.get("TT_TENSORBOARD") and importlib.util.find_spec("tensorboard") is None:
        print(f"tensorboard: FAILED: {sys.executable} cannot import tensorboard: pip install tensorboard, "
              "or put it on PYTHONPATH, or set TT_TENSORBOARD to a command that runs it", file=sys.stderr)
        return 1

    # A SIGTERM (a test runner's timeout) still stops TensorBoard and the browser.
    def stopped(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Failed("stopped by SIGTERM")

    signal.signal(signal.SIGTERM, stopped)
    started = time.monotonic()
    deadline = Deadline(args.timeout)
    seen = {}
    with tempfile.TemporaryDirectory(prefix="tt-tensorboard-") as workdir:
        try:
            listed, verdicts, cards = check(args, workdir, deadline, seen)
        except Failed as e:
            print(f"tensorboard: FAILED: {e}", file=sys.stderr)
            report(seen, args)
            return 1
        except Exception as e:  # noqa: BLE001 - the browser's client dying, say: still report
            print(f"tensorboard: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            report(seen, args)
            return 1
    took = time.monotonic() - started
    drawn_tags = [t for t, v in verdicts.items() if v is None]
    for tag in args.tags:
        runs = ", ".join(listed[tag])
        if verdicts[tag] is None:
            px = cards[tag]["pixels"]
            status = (f"chart drawn ({len([s for s in cards[tag]['series'] if s['visible']])} series paths, "
                      f"{max(s['points'] for s in cards[tag]['series'])} points, "
                      f"{px['distinct']} colours, {max(px['counts'])} px of a series colour)")
        else:
            status = f"chart NOT drawn: {verdicts[tag]}"
        print(f"tensorboard: {tag} (runs {runs}): shown, {status}")
    print(f"tensorboard: {len(args.tags)} tags listed and shown, {len(drawn_tags)} of their charts drawn, "
          f"in {took:.1f} s" + (f"; screenshot {args.screenshot}" if args.screenshot else ""))
    return 0


def report(seen, args):
    """What the check saw, for a failure."""
    out = sys.stderr
    listed = seen.get("listed")
    if listed is not None:
        print(f"  the API lists {len(listed)} scalar tags: {sorted(listed)[:40]}", file=out)
    if "driver" in seen:
        print(f"  page title: {seen.get('title')!r}", file=out)
    state = seen.get("state", {})
    for tag, card in sorted(state.get("cards", {}).items()):
        print(f"  card {tag}: {card.get('w', 0):.0f}x{card.get('h', 0):.0f}, series "
              f"{[(s['points'], s['stroke'], s['visible']) for s in card.get('series', [])][:6]}", file=out)
    for tag, verdict in seen.get("verdicts", {}).items():
        print(f"  {tag}: {verdict or 'drawn'}", file=out)
    if "driver" in seen:
        text = " | ".join(line.strip() for line in state.get("text", "").splitlines() if line.strip())
        print(f"  visible text: {text[:1500]!r}", file=out)
    tb = seen.get("tensorboard")
    if tb is not None:
        print("  TensorBoard's output:", file=out)
        for line in tb.output().splitlines()[-40:]:
            print("    " + line, file=out)


if __name__ == "__main__":
    sys.exit(main())
