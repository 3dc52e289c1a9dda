// Follows a run that is still going: the server sends the run's page body again each time the run
// changes (server-sent events, /runs/RUN_ID/live), and this swaps it in, keeping what the reader
// opened, typed and where they were reading. No other script runs on the dashboard.
(function () {
  "use strict";
  var root = document.getElementById("run");
  if (!root || !root.dataset.live || !window.EventSource) return;

  function keyOf(details) {
    var owner = details.parentElement.closest("[id]") || root;
    return owner.id + ":" + Array.prototype.indexOf.call(owner.querySelectorAll("details"), details);
  }

  function swap(html) {
    var open = Array.prototype.map.call(root.querySelectorAll("details[open]"), keyOf);
    var reason = root.querySelector("input[name=reason]");
    var typed = reason ? reason.value : "";
    var focused = reason && document.activeElement === reason;
    var atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    root.innerHTML = html;
    root.querySelectorAll("details").forEach(function (d) {
      if (open.indexOf(keyOf(d)) >= 0) d.open = true;
    });
    reason = root.querySelector("input[name=reason]");
    if (reason && typed) reason.value = typed;
    if (reason && focused) reason.focus();
    if (atEnd) window.scrollTo(0, document.body.scrollHeight);
  }

  var source = new EventSource(root.dataset.live);
  source.addEventListener("run", function (event) { swap(event.data); });
  source.addEventListener("end", function () {
    source.close();
    root.removeAttribute("data-live");
    root.classList.add("ended");
  });
})();
