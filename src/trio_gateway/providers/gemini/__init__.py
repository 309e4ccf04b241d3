"""Google Gemini and Vertex AI: request translation, the stream parser, and Vertex's OAuth."""
