"""The chat page at / in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium): a
question gets a streamed answer, the stop button ends a running one, conversations survive a reload, the
markdown renderer escapes what the model writes, and nothing is fetched from anywhere but the server."""

import shutil
import tempfile

import httpx
import pytest

from pyggml.serve.app import create_app
from tests.support.serve import ServerThread, make_state, write_chat_model

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver "
                                                                  "(apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_chat_model(tmp_path_factory.mktemp("page") / "tiny.gguf", n_ctx=1024)
    with ServerThread(create_app(make_state(path, n_ctx=1024))) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pyggml-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait(driver, script: str, timeout: float = 60.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(script))


def ask(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def test_the_page_is_one_file_that_fetches_nothing_outside(server):
    r = httpx.get(server.base_url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for outside in ("<script src", "<link", "@import", "url(", "src=\"http", "href=\"http"):
        assert outside not in r.text


def test_a_question_gets_a_streamed_answer_and_stop_ends_one(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server.base_url + "/")
    wait(browser, "return document.getElementById('status').textContent.startsWith('model: tiny')")
    assert not browser.find_element(By.ID, "image-button").is_displayed()    # no /props saying vision
    assert not browser.find_element(By.ID, "audio-button").is_displayed()    # no Whisper on this server
    max_tokens = browser.find_element(By.ID, "max_tokens")
    max_tokens.clear()
    max_tokens.send_keys("8")
    ask(browser, "Name three colours.")
    wait(browser, "return document.querySelector('.msg.assistant .stats') !== null")
    stats = browser.find_element(By.CSS_SELECTOR, ".msg.assistant .stats").text
    assert "tokens in" in stats and "tokens/s" in stats, stats
    assert browser.find_element(By.CSS_SELECTOR, ".msg.user").text == "Name three colours."

    max_tokens.clear()
    max_tokens.send_keys("900")
    # each read of the answer's stream waits 0.5 s, so the answer is still streaming when stop is clicked (the
    # tiny model can reach its end of text within a few tokens)
    browser.execute_script("""const read = ReadableStreamDefaultReader.prototype.read;
        ReadableStreamDefaultReader.prototype.read = function () {
            return new Promise(done => setTimeout(done, 500)).then(() => read.call(this)); };""")
    ask(browser, "Tell a long story.")
    wait(browser, "return document.querySelectorAll('.msg.assistant')[1].textContent.length > 0")  # streaming
    assert browser.find_element(By.ID, "stop").is_displayed()
    browser.find_element(By.ID, "stop").click()
    wait(browser, "return document.querySelectorAll('.msg.assistant .stats')[1]?.textContent === 'stopped'", 30)
    assert browser.find_element(By.ID, "send").is_enabled() and not browser.find_element(By.ID, "stop").is_displayed()
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched and all(url.startswith(server.base_url + "/") for url in fetched), fetched

    browser.refresh()   # the conversation is kept in the browser
    wait(browser, "return document.querySelectorAll('.msg.user').length === 2")
    assert "Name three colours." in browser.find_element(By.ID, "conversations").text


def test_markdown_renders_code_and_escapes_html(server, browser):
    browser.get(server.base_url + "/")
    html = browser.execute_script(
        "return renderMarkdown(arguments[0])",
        "# Title\n**bold** and `x<y`\n- one\n- two\n<img src=x onerror=alert(1)>\n"
        "```python\nprint('<b>')\n```\n[site](javascript:alert(1)) [ok](https://example.org)")
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<code>x&lt;y</code>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert '<pre><code class="language-python">print(&#39;&lt;b&gt;&#39;)</code></pre>' in html
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'href="javascript' not in html and 'href="https://example.org"' in html


@pytest.fixture(scope="module")
def whisper_server(tmp_path_factory):
    from pyggml.errors import WhisperFileError
    from pyggml.models.whisper.transcribe import load_whisper

    try:
        whisper = load_whisper("tiny.en")
    except (WhisperFileError, ImportError) as e:
        pytest.skip(f"Whisper tiny.en is not installed (the whisper extra): {e}")
    path = write_chat_model(tmp_path_factory.mktemp("page-audio") / "tiny.gguf")
    with ServerThread(create_app(make_state(path, whisper=whisper))) as srv:
        yield srv


def test_an_audio_upload_is_transcribed_into_the_message_box(whisper_server, browser):
    from pathlib import Path

    from selenium.webdriver.common.by import By

    browser.get(whisper_server.base_url + "/")
    wait(browser, "return !document.getElementById('audio-button').hidden")
    speech = Path(__file__).resolve().parents[1] / "data" / "speech" / "en1.wav"
    browser.execute_script("document.getElementById('audio-input').hidden = false")
    browser.find_element(By.ID, "audio-input").send_keys(str(speech))
    wait(browser, "return document.getElementById('input').value.length > 0", 120)
    assert "rain" in browser.find_element(By.ID, "input").get_attribute("value").lower()
