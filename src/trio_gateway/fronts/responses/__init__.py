"""OpenAI's Responses API: the HTTP route and stored responses (``route``), the request reader
(``request``), the events (``events``) and the seal of reasoning that goes back to a vendor
(``seal``)."""
