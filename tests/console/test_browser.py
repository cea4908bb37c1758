"""The console in a real browser (headless Chromium), against a real relay
with real gRPC clients. Skipped, saying why, without Chromium or Playwright."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.console.browser import browser, missing_browser, zone

pytestmark = [pytest.mark.skipif(missing_browser() is not None,
                                 reason=missing_browser() or ""),
              pytest.mark.timeout(90)]

# The console polls once a second: a client is on the page within 2 s.
SHOWN_WITHIN_MS = 2000
TOKEN = "s3cret-console-token"


async def test_a_connecting_client_appears_within_2s_with_no_console_error() -> None:
    async with zone() as relay, browser() as opened:
        page = opened.page
        await page.goto(relay.console)
        await page.locator("#main").wait_for(state="visible")
        client = await relay.connect("envoy-a", "c0", "c1")
        await relay.ack(client)
        connected = time.monotonic()
        row = page.locator("#clients tbody tr", has_text="envoy-a")
        await row.wait_for(timeout=SHOWN_WITHIN_MS)
        assert time.monotonic() - connected < SHOWN_WITHIN_MS / 1000
        await page.locator("#clients tbody tr", has_text="SYNCED").wait_for()
        assert await row.locator("td").nth(3).text_content() == "delta"
        assert opened.errors == []


async def test_a_nack_appears_with_its_message() -> None:
    async with zone() as relay, browser() as opened:
        client = await relay.connect("envoy-nacking", "c0")
        await relay.nack(client, "cluster c0: unknown load balancing policy")
        page = opened.page
        await page.goto(relay.console)
        row = page.locator("#clients tbody tr", has_text="envoy-nacking")
        await row.locator(".state", has_text="NACKED").first.wait_for()
        assert await row.locator("td.nack").text_content() == \
            "Cluster: cluster c0: unknown load balancing policy"
        assert await page.locator("#states [data-state=nacked]").text_content() == "NACKED 1"
        assert opened.errors == []


async def test_a_client_page_shows_its_last_nack_in_full() -> None:
    message = "line one of the rejection\n" + "x" * 400 + "\nlast line"
    async with zone() as relay, browser() as opened:
        client = await relay.connect("envoy-detail", "c0", "c1")
        await relay.nack(client, message)
        page = opened.page
        await page.goto(relay.console)
        await page.locator("#clients td.node a", has_text="envoy-detail").click()
        await page.locator("#client-page").wait_for(state="visible")
        assert await page.locator("#client .last-nack pre").text_content() == message
        assert await page.locator("#client h2.node").text_content() == "envoy-detail"
        names = page.locator("#client table.resources tbody td:first-child")
        assert sorted(await names.all_text_contents()) == ["c0", "c1"]
        assert opened.errors == []


async def test_a_node_id_holding_markup_shows_as_text() -> None:
    hostile = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    async with zone() as relay, browser() as opened:
        client = await relay.connect(hostile, "c0")
        await relay.nack(client, '<b id="bold">not bold</b>')
        page = opened.page
        await page.goto(relay.console)
        link = page.locator("#clients td.node a")
        await link.wait_for()
        assert await link.text_content() == hostile
        assert await page.locator("#clients td.nack").text_content() == \
            'Cluster: <b id="bold">not bold</b>'
        assert await page.locator("#clients img, #clients script, #bold").count() == 0
        assert await page.evaluate("window.pwned === undefined")
        await link.click()
        await page.locator("#client h2.node", has_text=hostile).wait_for()
        assert await page.locator("#client img, #client script, #bold").count() == 0
        assert await page.evaluate("window.pwned === undefined")
        assert opened.errors == []


async def test_the_charts_have_points() -> None:
    async with zone() as relay, browser() as opened:
        await relay.ack(await relay.connect("envoy-charted", "c0"))
        page = opened.page
        await page.goto(relay.console)
        clients_chart = page.locator("#charts figure").first
        # the sampler takes a point a second; the page draws what it has
        await page.wait_for_function(
            "() => Number(document.querySelector('#charts figure')"
            "?.getAttribute('data-points')) >= 2", timeout=10_000)
        assert await clients_chart.locator("figcaption span").first.text_content() == "Clients"
        points = await clients_chart.locator("polyline").first.get_attribute("points")
        assert points is not None and len(points.split()) >= 2
        assert await page.locator("#charts figure").count() == 6
        assert opened.errors == []


async def test_without_the_token_only_the_login_form_shows(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    async with zone(token_file=token_file) as relay, browser() as opened:
        await relay.ack(await relay.connect("envoy-secret-node", "c0"))
        page = opened.page
        await page.goto(relay.console)
        await page.locator("#login").wait_for(state="visible")
        assert await page.locator("#main").is_hidden()
        assert "envoy-secret-node" not in await page.content()
        refused = await page.request.get(relay.console + "console/data")
        assert refused.status == 401
        assert opened.errors == []


async def test_signing_in_sets_a_strict_http_only_cookie_not_the_token(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    async with zone(token_file=token_file) as relay, browser() as opened:
        await relay.ack(await relay.connect("envoy-behind-token", "c0"))
        page = opened.page
        await page.goto(relay.console)
        await page.locator("#token").fill("not-the-token")
        await page.locator("#login-form button").click()
        await page.locator("#login-error", has_text="wrong token").wait_for()
        await page.locator("#token").fill(TOKEN)
        await page.locator("#login-form button").click()
        await page.locator("#clients td.node a", has_text="envoy-behind-token").wait_for()
        assert await page.locator("#login").is_hidden()
        [cookie] = await opened.context.cookies()
        assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == \
            (True, "Strict", "/", False)
        assert TOKEN not in cookie["value"] and TOKEN not in page.url
        await page.locator("#logout").click()
        await page.locator("#login").wait_for(state="visible")
        assert await opened.context.cookies() == []
        # the one wrong-token answer (401) is the only console error
        assert len(opened.errors) == 1 and "401" in opened.errors[0]


async def test_each_origin_shows_its_server_connection_and_last_responses() -> None:
    async with zone() as relay, browser() as opened:
        admin = relay.relay.admin
        assert admin is not None
        now = time.time()
        # what /origins reports (relay.upstream.client.OriginStatus.to_json)
        admin.origins = lambda: [{
            "origin": "default", "server": "cp-b:18000", "fallback": 1,
            "servers": ["cp-a:18000", "cp-b:18000"], "connected": True, "since": now - 125,
            "reconnects": 3, "last_response": {"Listener": now - 2, "Cluster": now - 7}}]
        page = opened.page
        await page.goto(relay.console)
        row = page.locator("#origins tbody tr")
        await row.wait_for()
        cells = await row.locator("td").all_text_contents()
        # The ages are the page's, counted from when it drew: between what they
        # were at ``now`` and what they are once read (no race with the clock).
        late = int(time.time() - now) + 1
        assert cells[:2] == ["default", "cp-b:18000fallback"] and cells[3] == "3"
        connected = re.fullmatch(r"CONNECTED 2m (\d+)s", cells[2])
        assert connected is not None and 5 <= int(connected.group(1)) <= 5 + late, cells
        ages = re.fullmatch(r"Cluster: (\d+)s agoListener: (\d+)s ago", cells[4])
        assert ages is not None, cells
        assert 7 <= int(ages.group(1)) <= 7 + late and 2 <= int(ages.group(2)) <= 2 + late
        assert opened.errors == []
